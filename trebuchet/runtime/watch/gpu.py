"""GPU use of a run: each node's GPUs sampled by one of its agents, and the idle-GPU rule.

The query (nvidia-smi, else rocm-smi) is a child started from the agent's poll and read
once it ended, killed past QUERY_TIMEOUT_S: the poll never waits for it, and there is no
thread either (the agent forks its ranks with preexec_fn). Only the GPUs of the node's
mask count. Samples go to the run's metrics (`gpu.util.n<node>.g<index>`, `gpu.mem...`)
and the node's latest state to `attempt-<n>/gpu/node-<node>.json`.

`IdleWatch`, the controller's side: the GPUs are idle when no node that sampled had a
busy one for `idle_gpu_timeout` seconds; warn says so once per idle spell, fail ends the run.
"""

from __future__ import annotations

import math
import os
import signal
import subprocess
import time
from typing import TYPE_CHECKING, Any, Dict

from ..rundir.records import read_json, write_json
from .display_lines import shown

if TYPE_CHECKING:
    from .metric_reader import Writer

IDLE_UTIL = 5.0  # percent: at or below it a GPU is idle
QUERY_TIMEOUT_S = 5.0
INTERVAL_MAX_S = 10.0
INTERVAL_MIN_S = 1.0
STATE_DIR = "gpu"
NVIDIA = [
    "nvidia-smi",
    "--query-gpu=index,utilization.gpu,memory.used,memory.total",
    "--format=csv,noheader,nounits",
]
ROCM = ["rocm-smi", "--showuse", "--showmeminfo", "vram", "--csv"]
MASK_VARS = ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES")
Sample = Dict[str, Any]  # {index, util, mem, mem_total}


def interval(config: dict[str, Any]) -> float:
    idle = config.get("idle_gpu_timeout")
    if isinstance(idle, (int, float)) and idle > 0:
        return max(INTERVAL_MIN_S, min(INTERVAL_MAX_S, float(idle) / 4))
    return INTERVAL_MAX_S


def wanted(config: dict[str, Any] | None) -> bool:
    gpus = (config or {}).get("gpus")
    return isinstance(gpus, int) and not isinstance(gpus, bool) and gpus != 0


def _number(text: str) -> float | None:
    try:
        v = float(text.strip().rstrip("%"))
    except ValueError:  # `[N/A]`, `[Not Supported]`
        return None
    return v if v == v and abs(v) < 1e12 else None


def parse_nvidia(out: str) -> list[Sample]:
    found = []
    for line in out.splitlines()[:64]:
        parts = line.split(",")
        if len(parts) != 4 or not parts[0].strip().isdigit():
            continue
        util, used, total = (_number(p) for p in parts[1:])
        found.append({"index": int(parts[0]), "util": util, "mem": used, "mem_total": total})
    return found


def parse_rocm(out: str) -> list[Sample]:
    """rocm-smi --csv: `device,GPU use (%),VRAM Total Memory (B),VRAM Total Used Memory (B)`."""
    lines = [ln for ln in out.splitlines() if ln.strip()]
    if not lines:
        return []
    head = [h.strip().lower() for h in lines[0].split(",")]

    def col(word: str) -> int:
        return next((i for i, h in enumerate(head) if word in h), -1)

    use, total, used = col("use (%)"), col("total memory"), col("used memory")
    found = []
    for line in lines[1:65]:
        parts = line.split(",")
        dev = parts[0].strip()
        dev = dev[4:] if dev.startswith("card") else dev
        if not dev.isdigit() or len(parts) != len(head):
            continue
        mib = 1.0 / (1 << 20)
        t = _number(parts[total]) if total >= 0 else None
        u = _number(parts[used]) if used >= 0 else None
        found.append({"index": int(dev), "util": _number(parts[use]) if use >= 0 else None,
                      "mem": None if u is None else round(u * mib, 1),
                      "mem_total": None if t is None else round(t * mib, 1)})  # fmt: skip
    return found


def mask_of(env: dict[str, str]) -> set[int] | None:
    for var in MASK_VARS:
        value = env.get(var)
        if value is not None:
            items = [v.strip() for v in value.split(",") if v.strip()]
            return {int(v) for v in items} if all(v.isdigit() for v in items) else None
    return None


class Sampler:
    def __init__(self, adir: str, node: int, every: float, mask: set[int] | None) -> None:
        self.adir = adir
        self.node = node
        self.every = every
        self.mask = mask
        self.state_path = os.path.join(adir, STATE_DIR, f"node-{node}.json")
        self.writer: Writer | None = None
        self.child: subprocess.Popen[bytes] | None = None
        self.kind = ""
        self.deadline = 0.0
        self.next_at = 0.0
        self.count = 0
        self.started = time.time()
        self.busy: float | None = None
        self.error: str | None = None  # set: no more sampling (no tool, it failed)

    def step(self) -> None:
        if self.error is not None:
            return
        mono = time.monotonic()
        if self.child is not None:
            if self.child.poll() is None:
                if mono >= self.deadline:
                    self._kill()
                    self.child.wait()
                    self.child = None
                    self._record([], f"{self.kind} did not answer in {QUERY_TIMEOUT_S:g}s")
                return
            self._ended(self.child)
            self.child = None
        if mono < self.next_at:
            return
        self.next_at = mono + self.every
        self._query()

    def _query(self) -> None:
        from ..process.procs import find_program

        path = os.environ.get("PATH")
        argv = NVIDIA if find_program("nvidia-smi", path, ".") else None
        if argv is None and find_program("rocm-smi", path, "."):
            argv = ROCM
        if argv is None:
            self.error = "no nvidia-smi or rocm-smi on PATH"
            self._record([], self.error)
            return
        self.kind = argv[0]
        try:
            self.child = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                          stderr=subprocess.DEVNULL, close_fds=True,
                                          start_new_session=True)  # fmt: skip
        except OSError as exc:
            self.error = f"{argv[0]}: {exc.strerror}"
            self._record([], self.error)
            return
        if self.child.stdout is not None:  # a grandchild holding the pipe never blocks us
            os.set_blocking(self.child.stdout.fileno(), False)
        self.deadline = time.monotonic() + QUERY_TIMEOUT_S

    def _ended(self, child: subprocess.Popen[bytes]) -> None:
        out = b""
        if child.stdout is not None:
            try:  # what it wrote before it ended (non-blocking: at most 64 KiB)
                out = os.read(child.stdout.fileno(), 1 << 16)
            except OSError:
                out = b""
            child.stdout.close()
        text = out.decode(errors="replace")
        samples = parse_nvidia(text) if self.kind == "nvidia-smi" else parse_rocm(text)
        if self.mask is not None:
            samples = [s for s in samples if s["index"] in self.mask]
        if child.returncode != 0 or not samples:
            self._record([], f"{self.kind} exited {child.returncode} with no GPU listed")
            return
        self._record(samples, None)

    def _record(self, samples: list[Sample], error: str | None) -> None:
        wall = time.time()
        if samples:
            if any((s["util"] or 0.0) > IDLE_UTIL for s in samples):
                self.busy = wall
            values = {}
            for s in samples:
                tag = f"n{self.node}.g{s['index']}"
                if s["util"] is not None:
                    values[f"gpu.util.{tag}"] = s["util"]
                if s["mem"] is not None:
                    values[f"gpu.mem.{tag}"] = s["mem"]
            self.count += 1
            if self.writer is None:
                from .metric_reader import Writer, metrics_dir  # its regexes: a sample's

                try:
                    os.makedirs(metrics_dir(self.adir), mode=0o700, exist_ok=True)
                    self.writer = Writer(
                        os.path.join(metrics_dir(self.adir), f"gpu-{self.node}.jsonl")
                    )
                except OSError:
                    pass
            if self.writer is not None and values:
                self.writer.add(self.count, values, wall)
        state = {"node": self.node, "t": round(wall, 3), "started": round(self.started, 3),
                 "busy": self.busy, "samples": samples, "error": error}  # fmt: skip
        try:
            os.makedirs(os.path.dirname(self.state_path), mode=0o700, exist_ok=True)
            write_json(self.state_path, state, durable=False)
        except OSError:
            return

    def _kill(self) -> None:
        if self.child is not None:
            try:
                os.killpg(self.child.pid, signal.SIGKILL)
            except OSError:
                self.child.kill()

    def close(self) -> None:
        if self.child is not None and self.child.poll() is None:
            self._kill()
        if self.child is not None:
            self.child.wait()
            if self.child.stdout:
                self.child.stdout.close()
            self.child = None
        if self.writer is not None:
            self.writer.close()


def sampler(adir: str, config: dict[str, Any] | None, procs: list[Any]) -> Sampler | None:
    """One agent per node samples: the one holding its local rank 0 (or its node process)."""
    if not wanted(config):
        return None
    first = next((p for p in procs if p.record and (
        p.local_rank == 0 or (p.rank is None and not p.launcher and p.name.startswith("node-"))
    )), None)  # fmt: skip
    if first is None:
        return None
    return Sampler(adir, int(first.node), interval(config or {}), mask_of(first.env))


def read_states(adir: str) -> list[dict[str, Any]]:
    """Every node's latest GPU state, checked (`_state`): a rank can write these files too."""
    folder = os.path.join(adir, STATE_DIR)
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return []
    out = []
    for name in names:
        if not (name.startswith("node-") and name.endswith(".json")):
            continue
        state = _state(read_json(os.path.join(folder, name), 1 << 20))
        if state is not None:
            out.append(state)
    return out


def _finite(v: Any) -> float | None:
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    return float(v) if ok else None


def _state(data: Any) -> dict[str, Any] | None:
    if not isinstance(data, dict):
        return None
    node = data.get("node")
    samples = [
        {"index": s["index"] if _small_int(s.get("index")) else None,
         **{k: _finite(s.get(k)) for k in ("util", "mem", "mem_total")}}
        for s in data.get("samples") or [] if isinstance(s, dict)
    ] if isinstance(data.get("samples"), list) else []  # fmt: skip
    error = data.get("error")
    error = shown(error)[:500] if isinstance(error, str) else None
    return {"node": node if _small_int(node) else None, "t": _finite(data.get("t")),
            "started": _finite(data.get("started")), "busy": _finite(data.get("busy")),
            "samples": samples, "error": error}  # fmt: skip


def _small_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 1 << 31


CHECK_S = 2.0


class IdleWatch:
    def __init__(self, adir: str, timeout: float, action: str, started: float) -> None:
        self.adir = adir
        self.timeout = float(timeout)
        self.action = action  # warn | fail
        self.started = started
        self.next_check = 0.0
        self.warned_for: float | None = None  # the busy time of the spell warned about

    def step(self, records: Any, attempt: int) -> bool:
        """True when the run must fail of an idle spell."""
        found = self.check()
        if found is None:
            return False
        records.event("idle_gpu", attempt=attempt, action=self.action, **found)
        records.say(idle_text(found, self.timeout, self.action))
        return self.action == "fail"

    def check(self, now: float | None = None) -> dict[str, Any] | None:
        mono = time.monotonic()
        if mono < self.next_check:
            return None
        self.next_check = mono + CHECK_S
        states = [s for s in read_states(self.adir) if s.get("samples")]
        if not states:
            return None
        now = time.time() if now is None else now
        last_busy = max([self.started] + [float(s["busy"]) for s in states if s.get("busy")])
        idle = now - last_busy
        if idle < self.timeout or self.warned_for == last_busy:
            return None
        self.warned_for = last_busy
        gpus = sum(len(s["samples"]) for s in states)
        return {"idle_s": round(idle, 1), "nodes": len(states), "gpus": gpus}


def idle_text(info: dict[str, Any], timeout: float, action: str) -> str:
    then = "failing the run" if action == "fail" else "the run goes on"
    return (f"idle GPUs: none of {info['gpus']} GPU(s) on {info['nodes']} node(s) was busy "
            f"(> {IDLE_UTIL:g}% utilisation) for {info['idle_s']:.0f}s "
            f"(idle_gpu_timeout {timeout:g}s): {then}")  # fmt: skip


def idle_settings(run_dir: str) -> tuple[float, str] | None:
    data = read_json(os.path.join(run_dir, "metrics.json"), 1 << 20)
    if not isinstance(data, dict):
        return None
    timeout, action = data.get("idle_gpu_timeout"), data.get("idle_gpu_action") or "warn"
    if not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or timeout <= 0:
        return None
    return float(timeout), action if action in ("warn", "fail") else "warn"


def idle_watch(run_dir: str, adir: str, started: float) -> IdleWatch | None:
    found = idle_settings(run_dir)
    return IdleWatch(adir, found[0], found[1], started) if found else None
