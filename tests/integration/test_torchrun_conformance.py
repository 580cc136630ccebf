"""torchrun conformance: PyTorch's own launcher test cases (test/distributed/launcher/
test_run.py, torch 2.13), their command lines as typed, run once through the real
`torchrun` and once through `treb run` with the same argv and environment; what a user
observes must be the same: success or failure, the files each rank writes, the variables
each rank sees, the logs --log-dir/--redirects/--tee leave and the lines the terminal shows.

The programs are this project's own (torchrun_cases/): each rank writes <dir>/<RANK> with
the variables of seen.py. Compared exactly: the launcher's rank variables and those a flag
sets (--rdzv-id's TORCHELASTIC_RUN_ID, --role's ROLE_NAME); by presence only: MASTER_ADDR,
MASTER_PORT and TORCHELASTIC_RUN_ID when no --rdzv-id is typed (torchrun: "none" or a
uuid; treb: its run id), as each launcher picks its own.

One test runs the whole matrix and reports every mismatch at once; KNOWN lists the cases
that cannot be the same, with why, and the test checks that they still differ (an entry
that came right must leave the list)."""

# ruff: noqa: F811 (a fixture imported from test_ssh_runs is named as an argument)
from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.conftest import needs
from tests.integration.test_ssh_runs import ssh_config  # noqa: F401 (fixture)

pytestmark = [pytest.mark.integration]
CASES_DIR = Path(__file__).parent / "torchrun_cases"
GUARD_S = 180  # a hang guard per launch, never a timing assertion
TORCHRUN = Path(sys.executable).parent / "torchrun"
EXACT = (
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
    "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME", "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_MAX_RESTARTS", "TEST_SENTINEL_PARENT",
)  # fmt: skip
PRESENT = ("MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID")


@dataclass
class Case:
    name: str  # test_run.py's test it comes from, and what varies
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    agents: int = 1  # launched this many times at once (torchrun's multiple agents)


COMMON = ["--monitor-interval=1", "--start-method=spawn"]
PY = ["{cases}/touch.py", "--touch-file-dir={dir}"]
SH = ["--no-python", "{cases}/touch.sh", "{dir}"]
ELASTIC = ["--rdzv-backend=c10d", "--rdzv-endpoint=localhost:{port}"]
PET = {"PET_NNODES": "1", "PET_NPROC_PER_NODE": "4", "PET_RDZV_ID": "{id}",
       "PET_MONITOR_INTERVAL": "1", "PET_START_METHOD": "spawn", "PET_NO_PYTHON": "1"}  # fmt: skip
LAUNCHED = ["--run-path", "--nnodes=1", "--nproc-per-node=1", "--monitor-interval=1"]
INIT = ["--run-path", "--nnodes=1", "--nproc-per-node=4", "--master-addr=localhost",
        "--master-port={port}", "--monitor-interval=1", "{cases}/init_method.py"]  # fmt: skip
PREFIX = {"TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE": "[rank${rank}]: "}
CASES = [
    Case(
        "launch_user_script_python",
        ["--nnodes=1", "--nproc-per-node=4", "--rdzv-id={id}", *COMMON, *PY],
    ),  # fmt: skip
    Case(
        "caffe2_bc (--master-addr/--master-port/--node-rank=0)",
        [
            "--nnodes=1",
            "--nproc-per-node=4",
            *COMMON,
            "--master-addr=localhost",
            "--master-port={port}",
            "--node-rank=0",
            *PY,
        ],
    ),  # fmt: skip
    Case(
        "launch_user_script_bash",
        ["--nnodes=1", "--nproc-per-node=4", "--rdzv-id={id}", *COMMON, *SH],
    ),  # fmt: skip
    Case(
        "bash with --module (refused)",
        [
            "--nnodes=1",
            "--nproc-per-node=4",
            "--rdzv-id={id}",
            *COMMON,
            "--no-python",
            "--module",
            "{cases}/touch.sh",
            "{dir}",
        ],
    ),  # fmt: skip
    Case("default_nproc", ["--nnodes=1", "--rdzv-id={id}", *COMMON, *SH]),
    Case("launch_with_env_vars (PET_*)", ["{cases}/touch.sh", "{dir}"], {**PET, "PET_MODULE": "0"}),
    Case(
        "env vars with PET_MODULE=1 (refused)",
        ["{cases}/touch.sh", "{dir}"],
        {**PET, "PET_MODULE": "1"},
    ),  # fmt: skip
    Case("nproc auto", ["--nnodes=1", "--nproc-per-node=auto", "--rdzv-id={id}", *COMMON, *SH]),
    Case("nproc 4", ["--nnodes=1", "--nproc-per-node=4", "--rdzv-id={id}", *COMMON, *SH]),
    Case(
        "nproc unknown (refused)",
        ["--nnodes=1", "--nproc-per-node=unknown", "--rdzv-id={id}", *COMMON, *SH],
    ),  # fmt: skip
    Case(
        "launch_elastic (--nnodes=1:2, c10d)",
        [
            "--nnodes=1:2",
            "--nproc-per-node=4",
            *ELASTIC,
            "--rdzv-conf='join_timeout=5,last_call_timeout=1,timeout=5'",
            "--rdzv-id={id}",
            *COMMON,
            *PY,
        ],
    ),  # fmt: skip
    Case(
        "elastic_worker_raise_exception",
        [
            "--nnodes=1:2",
            "--nproc-per-node=4",
            *ELASTIC,
            "--rdzv-conf='join_timeout=5,last_call_timeout=1,timeout=5'",
            "--rdzv-id={id}",
            "--monitor-interval=1",
            "--max-restarts=0",
            "--start-method=spawn",
            "{cases}/touch.py",
            "--fail",
        ],
    ),  # fmt: skip
    Case("launch_standalone", ["--nnodes=1", "--nproc-per-node=4", "--standalone", *COMMON, *PY]),
    Case("launch_run_path", ["--run-path", "--nnodes=1", "--nproc-per-node=4", *COMMON, *PY]),
    Case("is_torchelastic_launched", [*LAUNCHED, "{cases}/elastic.py", "--out-file={dir}/out"]),
    Case(
        "logs_specs=default",
        [*LAUNCHED, "--logs_specs=default", "{cases}/elastic.py", "--out-file={dir}/out"],
    ),  # fmt: skip
    Case(
        "logs_specs=DOESNOT_EXIST (refused)",
        [*LAUNCHED, "--logs_specs=DOESNOT_EXIST", "{cases}/elastic.py"],
    ),  # fmt: skip
    Case("init_method tcp://", [*INIT, "--init-method=tcp://localhost:{port}"]),
    Case("init_method env://", [*INIT, "--init-method=env://"]),
    Case(
        "capture_logs (--redirect=3 --tee=3, prefix template)",
        [
            "--nnodes=1",
            "--nproc-per-node=4",
            "--rdzv-id={id}",
            "--redirect=3",
            "--tee=3",
            *COMMON,
            *SH,
        ],
        PREFIX,
    ),  # fmt: skip
    Case(
        "--log-dir with -r 3 -t 0:3",
        [
            "--nproc-per-node=2",
            "--rdzv-id={id}",
            "--log-dir={dir}/logs",
            "-r",
            "3",
            "-t",
            "0:3",
            *PY,
        ],
        PREFIX,
    ),  # fmt: skip
    Case(
        "-r 3 without --log-dir (the terminal shows no rank line)",
        ["--nproc-per-node=2", "-r", "3", *PY],
        PREFIX,
    ),  # fmt: skip
    Case(
        "--local-ranks-filter=1 --tee=3",
        ["--nproc-per-node=2", "--local-ranks-filter=1", "--tee=3", *PY],
        PREFIX,
    ),  # fmt: skip
    Case("--role trainer", ["--nproc_per_node=2", "--role", "trainer", *PY]),
    Case(
        "--max-restarts=1, the first attempt fails",
        ["--nproc-per-node=2", "--max-restarts=1", *COMMON, *PY, "--fail-first"],
    ),  # fmt: skip
    Case("-m module", ["--nproc-per-node=2", "-m", "touch", "--touch-file-dir={dir}"]),
    Case(
        "launch_elastic_multiple_agents (two agents, c10d)",
        [
            "--nnodes=1:2",
            "--nproc-per-node=4",
            *ELASTIC,
            "--rdzv_conf=timeout=5",
            "--rdzv-id={id}",
            *COMMON,
            *PY,
        ],
        agents=2,
    ),  # fmt: skip
]
# Cases that cannot be the same, and why (the test checks they still differ).
KNOWN = {
    "launch_elastic_multiple_agents (two agents, c10d)": "treb has no rendezvous between "
    "separate `treb run` invocations: each starts its own job (4 ranks each, files 0-3), "
    "where torchrun's two agents join one of 8; treb's form of it is --node-rank (docs/cli.md)",
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _expand(word: str, values: dict[str, str]) -> str:
    """{cases}, {dir}, {port}, {id} in a word (str.format would read torchrun's ${rank})."""
    for key, value in values.items():
        word = word.replace("{" + key + "}", value)
    return word


@dataclass
class Seen:
    ok: bool
    files: dict[str, dict[str, str]]  # file name -> its NAME=value lines (rank files)
    logs: dict[str, str]  # --log-dir: path below <run id>_<...>/ -> content
    shown: list[str]  # stdout lines with a `creating` (what the terminal shows)
    out: str


def _observe(case: Case, launcher: list[str], root: Path, values: dict[str, str]) -> Seen:
    """One launch of the case (its `agents` launches at once) and what it left."""
    run_dir = root / "touch"
    run_dir.mkdir(parents=True)
    values = {**values, "cases": str(root / "proj"), "dir": str(run_dir)}
    argv = [_expand(w, values) for w in case.argv]
    env = {**os.environ, "TEST_SENTINEL_PARENT": "FOOBAR", "TREB_HOME": values["home"],
           "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
           **{k: _expand(v, values) for k, v in case.env.items()}}  # fmt: skip
    env = {k: v for k, v in env.items() if not k.startswith("PET_") or k in case.env}
    procs = [subprocess.Popen([*launcher, *argv], cwd=root / "proj", env=env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              start_new_session=True) for _ in range(case.agents)]  # fmt: skip
    outs = []
    for p in procs:
        try:
            out, err = p.communicate(timeout=GUARD_S)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, 9)
            out, err = p.communicate()
        outs.append((p.returncode, out, err))
    files = {}
    for f in sorted(run_dir.iterdir()):
        if f.is_file():
            text = f.read_text()
            files[f.name] = dict(ln.split("=", 1) for ln in text.splitlines() if "=" in ln) or {
                "content": text
            }
    logs = {}
    for f in sorted((run_dir / "logs").rglob("*")) if (run_dir / "logs").is_dir() else []:
        if f.is_file():
            rel = f.relative_to(run_dir / "logs").parts[1:]  # past <run id>_<unique>
            logs["/".join(rel)] = "".join(sorted(f.read_text().splitlines(keepends=True)))
    shown = sorted(ln for _, out, _ in outs for ln in out.splitlines() if "creating" in ln)
    text = "\n".join(f"rc={rc}\n{out}\n{err[-3000:]}" for rc, out, err in outs)
    return Seen(all(rc == 0 for rc, _, _ in outs), files, logs, shown, text)


def _differences(case: Case, a: Seen, b: Seen, run_id: str) -> list[str]:
    out = []
    if a.ok != b.ok:
        out.append(f"torchrun {'succeeded' if a.ok else 'failed'}, treb "
                   f"{'succeeded' if b.ok else 'failed'}")  # fmt: skip
    if sorted(a.files) != sorted(b.files):
        out.append(f"files: torchrun {sorted(a.files)}, treb {sorted(b.files)}")
    for name in sorted(set(a.files) & set(b.files)):
        fa, fb = a.files[name], b.files[name]
        # torchrun's id is --rdzv-id's unless it made a fresh one (or "none": treb's own)
        typed = fa.get("TORCHELASTIC_RUN_ID") == run_id
        exact = [*EXACT, *(["TORCHELASTIC_RUN_ID"] if typed else [])]
        if not typed and fb.get("TORCHELASTIC_RUN_ID") == run_id:
            out.append(f"{name}: TORCHELASTIC_RUN_ID: torchrun a fresh one, treb "
                       f"{fb.get('TORCHELASTIC_RUN_ID')!r}")  # fmt: skip
        for key in exact:
            if fa.get(key) != fb.get(key):
                out.append(f"{name}: {key} torchrun {fa.get(key)!r}, treb {fb.get(key)!r}")
        for key in PRESENT:
            if (key in fa) != (key in fb):
                out.append(f"{name}: {key} present: torchrun {key in fa}, treb {key in fb}")
        if "content" in fa and fa != fb:
            out.append(f"{name}: torchrun {fa}, treb {fb}")
    if a.logs != b.logs:
        out.append(f"--log-dir: torchrun {a.logs}, treb {b.logs}")
    if PREFIX.items() <= case.env.items() and a.shown != b.shown:
        out.append(f"terminal: torchrun {a.shown}, treb {b.shown}")
    return out


def test_torchrun_conformance_matrix(tmp_path: Path) -> None:
    """Every case of the matrix the same under torchrun and treb run (KNOWN apart)."""
    needs("torch")
    report, known_same = [], []
    for i, case in enumerate(CASES):
        values = {"id": str(uuid.uuid4().int), "home": str(tmp_path / "home")}
        launches = []
        for who, launcher in (("torchrun", [str(TORCHRUN)]),
                              ("treb", [sys.executable, "-m", "trebuchet", "run"])):  # fmt: skip
            root = tmp_path / f"{i}-{who}"
            shutil.copytree(CASES_DIR, root / "proj")
            launches.append((launcher, root, {**values, "port": str(_free_port())}))
        with ThreadPoolExecutor(2) as pool:  # the two at once: each has its own port
            seen = list(pool.map(lambda la, c=case: _observe(c, *la), launches))
        diff = _differences(case, *seen, values["id"])
        if case.name in KNOWN:
            if not diff:
                known_same.append(case.name)
            continue
        if diff:
            report.append(f"{case.name}:\n  " + "\n  ".join(diff)
                          + f"\n  torchrun said:\n{seen[0].out[-1500:]}\n  treb said:\n"
                          f"{seen[1].out[-1500:]}")  # fmt: skip
    same = len(CASES) - len(report) - len(KNOWN) + len(known_same)
    print(f"torchrun conformance: {same} of {len(CASES)} cases the same")
    assert not report, f"{len(report)} case(s) differ from torchrun:\n" + "\n".join(report)
    assert not known_same, f"now the same as torchrun, leave KNOWN: {known_same}"


ALLREDUCE = """\
import os, socket
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
t = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(t)
print(f"rank {os.environ['RANK']}/{os.environ['WORLD_SIZE']} group {os.environ['GROUP_RANK']}"
      f" on {socket.gethostname()} sum={t.item():g}", flush=True)
dist.destroy_process_group()
"""


@pytest.mark.ssh
def test_manual_launch_on_two_ssh_hosts(ssh_config: str, tmp_path: Path) -> None:
    """torchrun's manual multi-node launch: `treb run --nnodes 2 --node-rank K
    --master-addr TS1 --master-port P` typed on each host forms one 4-rank job (each
    `treb run` a run of its own that starts its node's ranks only)."""
    needs("torch")
    w = tmp_path / "proj"
    w.mkdir()
    (w / "allreduce.py").write_text(ALLREDUCE)
    addr = subprocess.run(["ssh", "-F", ssh_config, "ts1", "hostname -I"], capture_output=True,
                          text=True, timeout=60).stdout.split()[0]  # fmt: skip
    port = _free_port()
    repo = Path(__file__).resolve().parents[2]
    procs = []
    for k, host in enumerate(("ts1", "ts2")):
        line = (f"cd {w} && PATH={Path(sys.executable).parent}:$PATH "  # the user's venv
            f"TREB_HOME={tmp_path}/home-{host} PYTHONPATH={repo} "
                f"GLOO_SOCKET_IFNAME=eth0 {sys.executable} -m trebuchet run --nnodes 2 "
                f"--node-rank {k} --nproc-per-node 2 --master-addr {addr} --master-port {port} "
                "allreduce.py")  # fmt: skip
        procs.append(subprocess.Popen(["ssh", "-F", ssh_config, host, line], text=True,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE))  # fmt: skip
    outs = []
    for p in procs:
        try:
            outs.append(p.communicate(timeout=GUARD_S))
        except subprocess.TimeoutExpired:
            p.kill()
            outs.append(p.communicate())
    said = "\n".join(f"rc={p.returncode}\n{out}\n{err[-2000:]}" for p, (out, err) in
                     zip(procs, outs, strict=True))  # fmt: skip
    assert [p.returncode for p in procs] == [0, 0], said
    found = re.findall(r"rank (\d)/4 group (\d) on (ts\d) sum=10", said)
    assert sorted(found) == [("0", "0", "ts1"), ("1", "0", "ts1"), ("2", "1", "ts2"),
                             ("3", "1", "ts2")], said  # fmt: skip
