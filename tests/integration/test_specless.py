"""`treb run` without a spec (issue 28, cli/specless.py), as torchrun users type it: a real
2-rank gloo all-reduce locally, on the Slurm test cluster and on the ssh test hosts; the
spec it makes kept (`--print-spec`) and run again; `treb rerun`, `status`, `render RUN` of
a spec-less run; bad flags refused with exit 2; and a launcher missing on a node (torchrun
not on an ssh host's PATH) named as the cause with the host, the node and the PATH."""

# ruff: noqa: F811 (fixtures imported from the support modules are named as arguments)
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from tests.conftest import TrebFn, needs, status_json
from tests.integration.slurm_support import slurm_conf, streb  # noqa: F401 (fixtures)
from tests.integration.test_ssh_runs import ssh_config  # noqa: F401 (fixture)

pytestmark = [pytest.mark.integration]
GUARD_S = 300  # a hang guard for `treb run`, never a timing assertion

ALLREDUCE = """\
import os, socket, sys
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
t = torch.tensor([float(rank + 1)])
dist.all_reduce(t)
assert t.item() == world * (world + 1) / 2, t
print(f"rank {rank}/{world} on {socket.gethostname()} sum={t.item():g} args={sys.argv[1:]}",
      flush=True)
dist.destroy_process_group()
"""


def workdir(tmp_path: Path) -> Path:
    """A project folder holding the all-reduce script, as a torchrun user has one."""
    needs("torch")
    w = tmp_path / "proj"
    w.mkdir()
    (w / "allreduce.py").write_text(ALLREDUCE)
    return w


def said(out: str, world: int) -> dict[int, str]:
    """Rank -> the line it printed: every rank must have reached the same sum."""
    total = f"{world * (world + 1) / 2:g}"
    found = dict(re.findall(rf"rank (\d+)/{world} on (\S+) sum={total} args=", out))
    return {int(r): host for r, host in found.items()}


def test_torchrun_form_runs_records_and_reruns(treb: TrebFn, tmp_path: Path) -> None:
    """`treb run --nproc_per_node 2 allreduce.py --lr 1 --name x`: the script's own options
    (even one named as treb's --name) go to the script; the spec it made is recorded, so
    status, render RUN and rerun work as for a YAML run."""
    w = workdir(tmp_path)
    res = treb("run", "--nproc_per_node", "2", "allreduce.py", "--lr", "1", "--name", "x",
               cwd=w, timeout=GUARD_S)  # fmt: skip
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert sorted(said(res.stdout, 2)) == [0, 1], res.stdout
    assert "args=['--lr', '1', '--name', 'x']" in res.stdout
    st = status_json(treb)
    assert st["state"] == "SUCCEEDED" and st["name"] == "allreduce" and st["spec_path"] is None
    recorded = (Path(st["run_dir"]) / "spec.yaml").read_text()
    assert "procs_per_node: 2" in recorded and "- allreduce.py" in recorded
    text = treb("status", st["id"]).stdout
    assert f"spec    none given; as it ran: {st['run_dir']}/spec.yaml" in text
    rendered = treb("render", st["id"])
    assert rendered.returncode == 0, rendered.stderr
    assert "RANK=1" in rendered.stdout and "allreduce.py --lr 1 --name x" in rendered.stdout
    again = treb("rerun", st["id"], timeout=GUARD_S)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert sorted(said(again.stdout, 2)) == [0, 1]
    st2 = status_json(treb)
    assert st2["id"] != st["id"] and st2["state"] == "SUCCEEDED"


def test_print_spec_loads_back_and_runs(treb: TrebFn, tmp_path: Path) -> None:
    """--print-spec prints the launch as a spec and runs nothing; saved next to the code,
    that spec runs the same job (flags, -o and torchrun's --max-restarts carried)."""
    w = workdir(tmp_path)
    res = treb("run", "-n", "2", "--max-restarts", "1", "--rdzv-endpoint", "h:29400",
               "-o", "env.MARK=kept", "--print-spec", "--", "python", "allreduce.py", "--k", "3",
               cwd=w)  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert "--rdzv-endpoint h:29400: treb starts every node itself" in res.stderr
    assert not (Path(tmp_path / "treb-home") / "runs").exists() or not list(
        (tmp_path / "treb-home" / "runs").iterdir()
    )  # nothing was recorded
    (w / "job.yaml").write_text(res.stdout)
    ran = treb("run", str(w / "job.yaml"), timeout=GUARD_S)
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]
    assert sorted(said(ran.stdout, 2)) == [0, 1] and "args=['--k', '3']" in ran.stdout
    st = status_json(treb)
    assert st["spec_path"] == str(w / "job.yaml") and st["max_attempts"] == 2
    spec = json.loads((Path(st["run_dir"]) / "spec.json").read_text())
    assert spec["env"] == {"MARK": "kept"} and spec["command"] == [
        "python", "allreduce.py", "--k", "3"]  # fmt: skip


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["allreduce.py", "-n", "2"], None),  # not an error: -n is the script's
        (["job.yaml", "--", "ls"], "job.yaml and a command after --"),
        (["job.yaml", "allreduce.py"], "give a spec (.yaml) or a command, not both"),
        (["--node_rank", "1", "allreduce.py"], "--node-rank 1 with --nnodes 1: node ranks are"),
        (["--nproc-per-node", "xpu", "allreduce.py"], "no XPU on this machine"),
        (["--nproc-per-node", "x", "allreduce.py"], "Unsupported nproc_per_node value"),
        (["--nnodes", "2:20:30", "allreduce.py"], "give N or MIN:MAX"),
        (["--standalone", "--nnodes", "2", "allreduce.py"], "--standalone is one node"),
        (["-n", "2", "missing.py"], "missing.py: no such file in"),
        (["--"], "nothing after --"),
        ([], "give a spec (treb run job.yaml) or a command"),
        (["--nprocs", "2", "allreduce.py"], "--nprocs: not an option of treb run"),
        (["-n", "5000", "allreduce.py"], "procs_per_node: must be an integer between 1 and 1024"),
        (["job.yaml", "--print-spec"], "--print-spec prints the spec a command makes"),
    ],
)
def test_bad_flags_exit_2_with_a_clear_message(
    args: list[str], says: str | None, treb: TrebFn, tmp_path: Path
) -> None:
    w = workdir(tmp_path)
    (w / "job.yaml").write_text("command: python allreduce.py\n")
    if says is None:  # the script's own -n: runs (one rank), exit 0
        res = treb("run", *args, cwd=w, timeout=GUARD_S)
        assert res.returncode == 0 and "args=['-n', '2']" in res.stdout, res.stderr
        return
    res = treb("run", *args, cwd=w)
    assert res.returncode == 2, (res.returncode, res.stderr)
    assert says in res.stderr and "Traceback" not in res.stderr, res.stderr
    assert not (tmp_path / "treb-home" / "runs").is_dir() or not list(
        (tmp_path / "treb-home" / "runs").iterdir()
    )


def test_torchrun_missing_locally_is_named(treb: TrebFn, tmp_path: Path) -> None:
    """Locally treb refuses launcher torchrun when its own PATH lacks torchrun; a PATH the
    spec gives the ranks (env.PATH) is only searched by the node agent: the same cause."""
    w = workdir(tmp_path)
    res = treb("run", "-n", "2", "-o", "launcher=torchrun", "-o", "env.PATH=/usr/bin:/bin",
               "--", sys.executable, "allreduce.py", cwd=w, timeout=GUARD_S)  # fmt: skip
    assert res.returncode == 1, res.stdout[-3000:] + res.stderr[-3000:]
    assert re.search(r"^  cause: launcher_missing: treb: torchrun not found on \S+ \(node "
                     r"0\): not on its PATH, which was \S*/usr/bin:/bin$", res.stderr, re.M), res.stderr  # fmt: skip
    st = treb("status")
    assert "cause: launcher_missing" in st.stdout and "env.PATH" in st.stdout, st.stdout


@pytest.mark.ssh
def test_specless_on_two_ssh_hosts(treb: TrebFn, ssh_config: str, tmp_path: Path) -> None:
    """The torchrun form with --nnodes 2 on the two sshd hosts; ssh.setup puts this
    interpreter (it has torch) first on the hosts' PATH, as a user's venv."""
    w = workdir(tmp_path)
    setup = json.dumps([f"export PATH={Path(sys.executable).parent}:$PATH"])
    res = treb("run", "--nnodes", "2", "--nproc-per-node", "2", "--on", "ssh",
               "-o", "ssh.hosts=[ts1, ts2]", "-o", f"ssh.config_file={ssh_config}",
               "-o", f"ssh.setup={setup}", "-o", "env.GLOO_SOCKET_IFNAME=eth0",
               "allreduce.py", "--on", "x", cwd=w, timeout=GUARD_S)  # fmt: skip
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    hosts = said(res.stdout, 4)
    assert hosts == {0: "ts1", 1: "ts1", 2: "ts2", 3: "ts2"}, res.stdout
    assert "args=['--on', 'x']" in res.stdout
    st = status_json(treb)
    assert st["backend"] == "ssh" and st["state"] == "SUCCEEDED"


@pytest.mark.ssh
def test_torchrun_missing_on_an_ssh_host_is_named(
    treb: TrebFn, ssh_config: str, tmp_path: Path
) -> None:
    """launcher torchrun where the hosts' login PATH has no torchrun: the cause names the
    launcher, the host, the node and the PATH searched, with the fix (ssh.setup), on the
    terminal's end lines, in `treb status` and in `treb diagnose`; not a bare exit 127."""
    w = workdir(tmp_path)
    res = treb("run", "--nnodes", "2", "-n", "1", "--on", "ssh", "-o", "launcher=torchrun",
               "-o", "ssh.hosts=[ts1, ts2]", "-o", f"ssh.config_file={ssh_config}",
               "--", sys.executable, "allreduce.py", cwd=w, timeout=GUARD_S)  # fmt: skip
    assert res.returncode == 1, res.stdout[-3000:] + res.stderr[-3000:]
    cause = re.compile(r"cause: launcher_missing: treb: torchrun not found on (ts1|ts2) "
                       r"\(node ([01])\): not on its PATH, which was (\S+)")  # fmt: skip
    m = cause.search(res.stderr)
    assert m, res.stderr[-3000:]
    assert m.group(1) == ("ts1", "ts2")[int(m.group(2))]
    assert str(Path(sys.executable).parent) not in m.group(3).split(":")
    assert "ssh.setup" in res.stderr
    st = treb("status")
    assert cause.search(st.stdout) and "fix:" in st.stdout, st.stdout
    diag = json.loads(treb("diagnose", "--json").stdout)["root_cause"]
    assert diag["category"] == "launcher_missing", diag
    assert diag["node"] == m.group(2) and "not on its PATH" in diag["summary"]
    assert "ssh.setup" in diag["remedy"]


@pytest.mark.slurm
def test_specless_on_slurm_two_nodes(streb, tmp_path: Path) -> None:
    """The same all-reduce, spec-less, on the 2-node Slurm test cluster; then rerun."""
    w = workdir(tmp_path)
    res = streb("run", "--nnodes", "2", "-n", "2", "--on", "slurm", "allreduce.py", "--x",
                cwd=w, timeout=GUARD_S)  # fmt: skip
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert said(res.stdout, 4) == {0: "tn1", 1: "tn1", 2: "tn2", 3: "tn2"}, res.stdout
    st = status_json(streb)
    assert st["backend"] == "slurm" and st["state"] == "SUCCEEDED"
    again = streb("rerun", st["id"], timeout=GUARD_S)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert sorted(said(again.stdout, 4)) == [0, 1, 2, 3]
    assert status_json(streb)["backend"] == "slurm"


@pytest.mark.slurm
def test_torchrun_missing_on_slurm_nodes_is_named(streb, tmp_path: Path) -> None:
    """launcher torchrun with a PATH (env.PATH, as a module or profile might leave it) that
    has no torchrun on the nodes: the named cause, with the node and that PATH."""
    w = workdir(tmp_path)
    res = streb("run", "--nnodes", "2", "-n", "1", "--on", "slurm", "-o", "launcher=torchrun",
                "-o", "env.PATH=/usr/bin:/bin", "--", sys.executable, "allreduce.py",
                cwd=w, timeout=GUARD_S)  # fmt: skip
    assert res.returncode == 1, res.stdout[-3000:] + res.stderr[-3000:]
    m = re.search(r"cause: launcher_missing: treb: torchrun not found on (tn1|tn2) \(node "
                  r"([01])\): not on its PATH, which was \S*/usr/bin:/bin$", res.stderr, re.M)  # fmt: skip
    assert m and m.group(1) == ("tn1", "tn2")[int(m.group(2))], res.stderr[-3000:]
    diag = json.loads(streb("diagnose", "--json").stdout)["root_cause"]
    assert diag["category"] == "launcher_missing" and diag["node"] == m.group(2), diag


def test_a_script_outside_this_folder_runs_as_torchrun_runs_it(treb: TrebFn,
                                                                tmp_path: Path) -> None:  # fmt: skip
    """Issue 33 (low): `treb run ../other/train.py` passed the "script must be here" check,
    then failed as missing_file (the run's copy of this folder has no ../other). torchrun
    runs it relative to the current folder: so does treb, from where it is."""
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "train.py").write_text(
        "import os, sys; print('ran', sys.argv[1:], 'rank', os.environ['RANK'], flush=True)\n"
    )
    here = tmp_path / "here"
    here.mkdir()
    res = treb("run", "-n", "2", "../other/train.py", "--k", "1", cwd=here, timeout=GUARD_S)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "ran ['--k', '1'] rank 1" in res.stdout, res.stdout
    assert "outside this folder" in res.stderr, res.stderr
    # where the code travels (the current folder is what goes), it is refused up front
    res = treb("run", "--on", "kubernetes", "--print-spec", "../other/train.py", cwd=here)
    assert res.returncode == 2 and "outside this folder" in res.stderr, res.stderr
    assert "Traceback" not in res.stderr
