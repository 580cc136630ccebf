"""The causes trebuchet recognises: a category, the log lines that show it, a remedy.

Each rule has a strength. CAUSE lines explain a failure by themselves (an exception, an
out-of-memory, a port taken); TIMEOUT lines are what ranks print while they wait for a
rank that is not there (the cause is elsewhere, usually the rank that never joined);
CASCADE lines are what ranks print when they are torn down because another one failed.
The root cause is the strongest, earliest line: a CAUSE beats a TIMEOUT beats a CASCADE.

The patterns come from the messages of torch (c10d, gloo, NCCL's ProcessGroup), torchrun,
NCCL, Slurm (srun, slurmstepd) and the kernel, as they appear in real logs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

CAUSE, TIMEOUT, CASCADE = 2, 1, 0

# Where a rank's whole output is; engine.fit_remedy puts the run's id and the rank in (or,
# for logs from elsewhere, the file to read).
LOGS_HINT = "`treb logs RUN --rank R` has its whole output"
# How to see what the partitions have; the engine (Backend.explain_ending: `resources`) puts
# in what its scheduler has when it can.
SINFO_HINT = "`sinfo -o '%P %D %c %m %G %f'` lists each partition's nodes, CPUs, memory, GPUs"

# The categories, in the order of docs/diagnose.md, with their one-line remedies.
REMEDIES: dict[str, str] = {
    "python_exception": "Fix the error at the user-code frame shown; run that rank's command "
    f"alone ({LOGS_HINT}) to reproduce it.",
    "killed": "SIGKILL without a launcher kill is usually the kernel OOM killer: use less host "
    "memory per node (fewer DataLoader workers or ranks per node, smaller buffers) or ask for "
    "more (slurm.mem); `dmesg` or the Slurm oom-kill message confirms it.",
    "gpu_oom": "Lower the per-GPU batch size or sequence length, use mixed precision or "
    "activation checkpointing, or shard the model (FSDP/ZeRO); "
    "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True helps with fragmentation.",
    "collective_timeout": "A rank never reached the collective (it crashed, hung or was "
    "slower than the timeout): look at the rank named here; raise init_process_group(timeout=) "
    "only when it is merely slow (rank 0 saving a checkpoint while the others wait).",
    "hang": "No rank made progress for hang_timeout: look at the rank(s) apart from the "
    "others at the frame shown (a data loader, a lock, a rank that skipped the collective); "
    "each rank's stack is in attempt-<n>/stacks/, `treb stacks RUN` takes fresh ones.",
    "idle_gpu": "No GPU of the run was busy for idle_gpu_timeout (idle_gpu_action: fail): the "
    "ranks never reached the GPU (data loading, a CPU-only code path, a device mask that hides "
    "the GPUs) or waited on something else; `treb logs RUN` shows where they were, and "
    "`treb metrics RUN gpu.util` the samples. Raise idle_gpu_timeout when a long CPU phase is "
    "expected.",
    "port_in_use": "Another process holds the port: drop master_port from the spec (each "
    "attempt then gets a free one) or pick a port nobody uses (`ss -ltnp` shows the holder).",
    "network_unreachable": "The ranks cannot reach each other: set GLOO_SOCKET_IFNAME / "
    "NCCL_SOCKET_IFNAME to the interface that links the nodes (never lo) and check that "
    "MASTER_ADDR resolves to that interface's address on every node.",
    "missing_module": "The environment the ranks ran in lacks a package or program: install it "
    "there (environment: requirements) or fix PATH/PYTHONPATH so every node sees the same one.",
    "bad_command": "The command could not start: a program name that is mistyped or not "
    "installed where the ranks run (`which NAME` there; install it, fix PATH or give its full "
    "path), a script that is not executable (chmod +x, or run it as `bash x.sh` / `python "
    "x.py`), or a line bash cannot parse (check the quoting of command:, which YAML reads "
    "before bash does; `treb render SPEC` shows the line bash gets).",
    "launcher_missing": "The node's launcher program is not on the PATH its agent searched "
    "(the cause names the host, the node and that PATH). Over ssh that is the login shell's "
    "PATH, without what ~/.bashrc adds for interactive shells: add an ssh.setup line that "
    "activates the environment that has it (`source /path/to/venv/bin/activate`, `module "
    "load ...`) or install it on every host. On Slurm and locally it is the submitting "
    "shell's: activate that environment before `treb run`, set env.PATH, or build one with "
    "an environment: block whose requirements have it (torchrun: torch; horovodrun: horovod; "
    "mpirun: OpenMPI). Or use launcher: native, which needs no launcher program; `ssh HOST "
    "command -v torchrun` shows what a host finds.",
    "missing_file": "A file the command opens is not where it runs: when the cause says the "
    "code snapshot left it out, follow what it says (un-ignore it, remove it from "
    ".trebignore, or set snapshot: false); otherwise fix the path (relative to the workdir).",
    "disk_full": "A file system is full (the one named: TREB_HOME's holds the logs and "
    "records, checkpoints go to TREB_CHECKPOINT_DIR): free space there or move TREB_HOME to a "
    "bigger one; `treb doctor` shows the free space.",
    "environment_build": "The run's environment could not be built, so nothing ran: when a "
    "package was not found, fix its name or version in environment.requirements (a typo, a "
    "version that does not exist for this Python) or point the installer at the index that has "
    "it (UV_INDEX_URL, PIP_INDEX_URL, PIP_FIND_LINKS); otherwise fix the step environment.log "
    "shows failing. `treb build SPEC` retries the build alone.",
    "setup_failed": "A line of the node's setup (ssh.setup) failed, so no rank started there: "
    "the cause names the line and shows its last output (attempt-<n>/setup-node-<i>.log holds "
    "all of it). Setup runs in bash with errexit and pipefail, item after item: fix the line, or "
    "the host it expects (the venv to activate, the module to load; `ssh HOST bash -lc "
    "'<line>'` tries it), or end a command that may fail with `|| true`; `treb check` parses "
    "the lines first.",
    "node_unhealthy": "A node failed its health checks before the attempt's ranks started, so "
    "none started there and the node is excluded from the rest of the run "
    "(docs/recovery.md): the cause names the check. disk: free space where it says; shared: "
    "the run directory must be on a file system every node mounts at the same path; gpus: the "
    "node's driver or its GPUs (nvidia-smi -L); master: the network between the nodes; user: "
    "your health_check's output is in attempt-<n>/health-<node>.log. `treb status` lists "
    "every node's checks.",
    "node_lost": "A node went away during the attempt (its agent fell silent for "
    "node_timeout, or its agent or connection ended without a last word), so its ranks were "
    "stopped and the node is excluded from the rest of the run (docs/recovery.md): the run "
    "resumes on a spare if spare_nodes is set (or on fewer nodes with nodes: MIN:MAX) and "
    "retries are left; otherwise resubmit, after checking the node (its host, network, or "
    "Slurm's `scontrol show node`). Save checkpoints to TREB_CHECKPOINT_DIR so that the "
    "next attempt resumes.",
    "launch_env_missing": "The script expects a launcher's variables (RANK, WORLD_SIZE, ...): "
    "run it with launcher: native or torchrun, or call trebuchet.dist.init_env() so srun, "
    "mpirun and SkyPilot variables fill them.",
    "segfault": "A native crash: check that torch, CUDA/ROCm, NCCL and the driver match and "
    "that wheels were built for this CPU; rerun with PYTHONFAULTHANDLER=1 (or under gdb) "
    "for the native stack.",
    "aborted": "The process aborted itself (SIGABRT): the lines just before the abort say why, "
    "usually an uncaught C++ exception (`terminate called after throwing ... what(): ...`), a "
    "failed assertion, or a library giving up (NCCL's watchdog aborts a rank whose collective "
    "timed out: look for a timeout on the other ranks); fix what that message names, and rerun "
    "with PYTHONFAULTHANDLER=1 for the Python stack at the abort.",
    "exit_abort": "The rank's program finished its work, then aborted as its process shut "
    "down (SIGABRT, `terminate called without an active exception`): torch's process group "
    "was still alive at exit, and its threads were torn down with the interpreter. Call "
    "`torch.distributed.destroy_process_group()` at the end of the program, on every rank, "
    "after the last collective. Where it does (Accelerate's end_training() does), a model "
    "wrapped in DistributedDataParallel still holds the group: free it first (`del model`, "
    "and what refers to it, with gc.collect(); Accelerate: `accelerator.free_memory(model, "
    "optimizer)`), then destroy the group (gloo's threads outlive the interpreter otherwise, "
    "pytorch/pytorch#179291). Until then the exit status is a failure (as under torchrun): "
    "the run is FAILED and retries: starts it again; PYTHONFAULTHANDLER=1 in env: makes the "
    "diagnosis certain (the Python stack at the abort is empty).",
    "time_limit": "The attempt reached its time limit: raise timeout: (or slurm.time), or save "
    "checkpoints on the warning signal (checkpoint_signal) and set retries: to resume.",
    "node_failure": "A node (or the process supervising the run) went away: resubmit; exclude "
    "the node if it happens again, and use retries: with checkpoints to ride it out.",
    "scheduler_refusal": "Slurm refused the job as asked, so nothing ran: ask only for what a "
    f"partition's nodes have ({SINFO_HINT}): fix slurm.partition, nodes, gpus_per_node, "
    "slurm.mem, slurm.constraint or slurm.sbatch_args; `treb check SPEC --on slurm` catches "
    "some of these before submitting.",
    "cancelled": "Nothing failed: the run was cancelled (treb cancel, Ctrl+C, scancel or a "
    "preemption); resubmit it when wanted.",
    "stopped_by_slurm": "Nothing in the log failed: Slurm stopped every task because the job "
    "ended from outside (its time limit, a scancel, a preemption, a lost node, or Ctrl+C on "
    "srun), and "
    "slurmstepd's line saying which (`*** ... CANCELLED AT ... DUE TO ...`) did not reach "
    "this log (srun can end before it is forwarded). Ask Slurm: `sacct -j JOBID -o "
    "JobID,State,Reason,Elapsed,Timelimit`. TIMEOUT: raise the time limit, or checkpoint on "
    "the warning signal and resume with retries:; CANCELLED: nothing failed; NODE_FAIL or "
    "PREEMPTED: resubmit (retries: with checkpoints rides it out).",
    "unknown": "No known cause was found: read the evidence lines and the failing rank's "
    f"whole log ({LOGS_HINT}).",
}
# Remedies fitted to what the run tells (engine.fit_remedy picks them).
SEGFAULT_CPU = (
    "A native crash in compiled code on a run without GPUs: a C extension or wheel that does "
    "not match this Python, CPU or system libraries (SIGILL: built for a newer CPU), or a bug "
    "in one: rerun with PYTHONFAULTHANDLER=1 (or under gdb) for the stack of the crash, then "
    "reinstall or upgrade the package it crashed in (`pip check` finds mismatches)."
)
TIME_LIMIT_SILENT = (
    "No rank wrote anything for a long stretch before the limit: the program most likely hung "
    "(a rank stuck in I/O or data loading, a deadlock, a collective waiting for an absent rank), "
    "and more time would not help. The last lines shown say where it stopped; to see where it "
    "waits, dump its stacks while it hangs (py-spy dump --pid PID, or "
    "faulthandler.dump_traceback_later in the program); raise timeout: only if it was slow."
)
CATEGORIES = tuple(REMEDIES)
TITLES: dict[str, str] = {
    "python_exception": "Python exception",
    "killed": "killed (kernel OOM killer or kill -9)",
    "gpu_oom": "GPU out of memory (CUDA/HIP)",
    "collective_timeout": "collective or rendezvous timeout",
    "hang": "hang (no progress for hang_timeout)",
    "idle_gpu": "idle GPUs (none busy for idle_gpu_timeout)",
    "port_in_use": "port already in use",
    "network_unreachable": "peers unreachable / wrong network interface",
    "missing_module": "missing module or wrong environment",
    "bad_command": "command not found, not executable, or not valid shell",
    "launcher_missing": "launcher program (torchrun, mpirun, horovodrun) not found on a node",
    "missing_file": "file not found (not in the code snapshot, or a wrong path)",
    "disk_full": "no space left on device (or quota exceeded)",
    "environment_build": "environment build failed",
    "setup_failed": "a node's setup failed before its ranks started",
    "node_unhealthy": "a node failed its health checks before its ranks started",
    "node_lost": "a node was lost during the attempt",
    "launch_env_missing": "script not started by a launcher",
    "segfault": "native crash (segmentation fault, illegal instruction, bus error)",
    "aborted": "aborted (SIGABRT: an uncaught C++ exception, a failed assertion)",
    "exit_abort": "aborted at exit, after the program finished (its process group alive)",
    "time_limit": "time limit reached",
    "node_failure": "node failure",
    "scheduler_refusal": "the scheduler refused the job",
    "cancelled": "cancelled",
    "stopped_by_slurm": "stopped by Slurm, why not in the log (time limit, cancel, node)",
    "unknown": "unknown",
}

# What exit codes mean (128 + N: killed by signal N). Some launchers (srun, the seed's
# checklist) report a signal number as the code: 9 and 15 are read as SIGKILL and SIGTERM.
EXIT_CODES: dict[int, str] = {
    1: "a Python error (uncaught exception) or another failure",
    2: "a usage error (bad arguments)",
    9: "SIGKILL, as some tools report it (usually the OOM killer)",
    15: "SIGTERM, as some tools report it (stopped in the cascade)",
    126: "the command is not executable",
    127: "the command was not found",
    129: "SIGHUP (the terminal or session went away)",
    130: "SIGINT (Ctrl+C)",
    132: "SIGILL (illegal instruction: a binary built for another CPU)",
    134: "SIGABRT (abort: an uncaught C++ exception, an assertion, the NCCL watchdog)",
    135: "SIGBUS (bus error)",
    136: "SIGFPE (arithmetic error)",
    137: "SIGKILL (the kernel OOM killer, or kill -9)",
    139: "SIGSEGV (segmentation fault)",
    143: "SIGTERM (stopped: the cascade after another rank failed, a cancel or a limit)",
}
SIGNAL_CATEGORY = {"SIGSEGV": "segfault", "SIGILL": "segfault", "SIGBUS": "segfault",
                   "SIGFPE": "segfault", "SIGABRT": "aborted", "SIGKILL": "killed"}  # fmt: skip
STOP_SIGNALS = frozenset({"SIGTERM", "SIGINT", "SIGHUP"})
SIGNAL_NAMES = {1: "SIGHUP", 2: "SIGINT", 4: "SIGILL", 6: "SIGABRT", 7: "SIGBUS", 8: "SIGFPE",
                9: "SIGKILL", 11: "SIGSEGV", 15: "SIGTERM"}  # fmt: skip


def signal_of(exit_code: int | None, signal: str | None) -> str | None:
    """The signal a process died of, from a recorded name or a 128+N / -N exit code."""
    if signal:
        return signal
    if exit_code is None:
        return None
    num = -exit_code if exit_code < 0 else exit_code - 128 if exit_code > 128 else None
    return SIGNAL_NAMES.get(num) if num else None


def exit_meaning(exit_code: int | None, signal: str | None = None) -> str:
    """'exit code 137: SIGKILL (the kernel OOM killer, or kill -9)' and the like."""
    if exit_code is None and not signal:
        return "no exit status recorded"
    if exit_code is not None and exit_code < 0:  # torchrun's -N
        exit_code = 128 - exit_code
    text = f"exit code {exit_code}" if exit_code is not None else f"signal {signal}"
    meaning = EXIT_CODES.get(exit_code) if exit_code is not None else None
    return f"{text}: {meaning}" if meaning else text


@dataclass(frozen=True)
class Rule:
    category: str  # one of CATEGORIES, or "cascade"
    strength: int
    pattern: re.Pattern[str]
    loopback: bool = False  # only a fault when the ranks span several hosts


# The kernel's or Slurm's word that the OOM killer struck (a SIGKILL is then its, not srun's).
OOM_KILLED = (
    r"oom-kill|oom_kill|Out of memory: Killed process|invoked oom-killer"
    r"|Memory cgroup out of memory"
)

# slurmstepd's word that it cancelled a job or step (slurmstepd/req.c): `*** STEP 2.0 ON tn1
# CANCELLED AT <time> DUE TO TIME LIMIT ***` (PREEMPTION, NODE FAILURE, JOB REQUEUE, none);
# Slurm 25.05 words a scancel `DUE to SIGNAL Terminated`. `DUE TO TASK FAILURE` is no cancel
# but a task's failure (--kill-on-bad-exit), and is left out. One pattern: the rules below
# read it in a rank's log, sources.merged_log in a job's; CANCEL_WHY is what the why means.
SLURM_CANCELLED = (
    r"\*\*\* (?:JOB|STEP) \S+ (?:ON (?P<node>\S+) )?CANCELLED AT (?P<at>\S+)"
    r"(?: DUE [Tt][Oo] (?!TASK FAILURE)(?P<why>[A-Za-z ]+?))?(?:,[^*]*)? \*\*\*"
)
CANCEL_WHY = {"TIME LIMIT": "time_limit", "NODE FAILURE": "node_failure"}  # else cancelled


def _rule(category: str, strength: int, pattern: str, loopback: bool = False) -> Rule:
    return Rule(category, strength, re.compile(pattern), loopback)


# Order matters: the first rule that matches a line decides its category.
RULES: tuple[Rule, ...] = (
    _rule("gpu_oom", CAUSE, r"(?:CUDA|HIP) out of memory|torch\.(?:cuda\.)?OutOfMemoryError"
          r"|CUBLAS_STATUS_ALLOC_FAILED|HIP_ERROR_OutOfMemory|hipErrorOutOfMemory"
          r"|cudaErrorMemoryAllocation|CUDA error: out of memory|Cuda failure 'out of memory'"),
    _rule("killed", CAUSE, OOM_KILLED),
    _rule("environment_build", CAUSE, r"was not found in the package registry|there is no "
          r"version of \S+|No matching distribution found for|Could not find a version that "
          r"satisfies the requirement|PackagesNotFoundError|nothing provides requested"
          r"|ResolvePackageNotFound|No solution found when resolving dependencies"),
    _rule("launch_env_missing", CAUSE,
          r"environment variable (?:RANK|WORLD_SIZE|MASTER_ADDR|MASTER_PORT|LOCAL_RANK) "
          r"expected, but not set|KeyError: '(?:RANK|WORLD_SIZE|LOCAL_RANK|LOCAL_WORLD_SIZE"
          r"|MASTER_ADDR|MASTER_PORT)'|must be launched with (?:torchrun|a launcher)"),
    _rule("missing_module", CAUSE, r"ModuleNotFoundError: No module named|ImportError: "
          r"|cannot open shared object file|undefined symbol: |GLIBC_[\d.]+' not found"),
    # the node agent's own line (runtime/process/unstarted.py), a shell's for a launcher by name
    _rule("launcher_missing", CAUSE, r"^treb: (?:torchrun|mpirun|horovodrun) not found on "
          r"\S+ \(node \d+\)|\b(?:torchrun|mpirun"
          r"|horovodrun): (?:command )?not found$|command not found: (?:torchrun|mpirun"
          r"|horovodrun)$"),
    # bash, dash (`sh: 1: x: not found`), zsh; a list command's exec (treb: cannot start);
    # a missing interpreter (`/usr/bin/env: 'python3': No such file`); a shell syntax error
    _rule("bad_command", CAUSE, r": command not found|command not found: |^\S*sh: \d+: .*: not "
          r"found$|treb: cannot start |^(?:/usr)?/bin/env: .+: No such file or directory"
          r"|^\S*sh: (?:line \d+: )?\S+: Permission denied$|syntax error near unexpected token"
          r"|syntax error: unexpected end of file|unexpected EOF while looking for matching"
          r"|^\S*sh: (?:-c: )?(?:line )?\d+: Syntax error: "),
    _rule("disk_full", CAUSE, r"No space left on device|Disk quota exceeded|\bENOSPC\b"
          r"|database or disk is full"),
    _rule("missing_file", CAUSE, r"can't open file .*No such file|FileNotFoundError: "
          r"|No such file or directory"),
    _rule("port_in_use", CAUSE, r"EADDRINUSE|[Aa]ddress already in use|errno: 98\b"),
    _rule("network_unreachable", CAUSE, r"remote=\[(?:127\.\d+\.\d+\.\d+|::1|::ffff:127\.[\d.]+)\]",
          loopback=True),
    _rule("network_unreachable", CAUSE, r"Network is unreachable|No route to host"
          r"|Name or service not known|Temporary failure in name resolution"
          r"|Connect to \S+<\d+> failed|Software caused connection abort|NCCL WARN .*connect"
          r"|Bootstrap : no socket interface found|unhandled system error"
          # horovodrun across hosts whose interfaces are named differently
          r"|Unable to find a set of common task-to-task communication interfaces"
          r"|Cannot find an IPv4 address of the common interface"),
    _rule("collective_timeout", TIMEOUT, r"Watchdog caught collective operation timeout"
          r"|wait timeout after \d+ ?ms|Timed out waiting \d+ ?ms for (?:recv|send) operation"
          r"|retr(?:ie|ei)ving ncclUniqueId from \[\d+\]|crash on rank \d+|Socket Timeout"
          r"|client socket has timed out after|store based barrier|failed to pass monitoredBarrier"
          r"|RendezvousTimeoutError|waiting for clients\. \d+/\d+ clients joined|Connect timeout"
          r"|timed out connecting|collective operation timeout|DistStoreError"
          r"|detected by watchdog at work"),
    _rule("segfault", CAUSE, r"Segmentation fault|SIGSEGV|Illegal instruction|SIGILL|SIGBUS"
          r"|Bus error|Floating point exception|Signal (?:11|4|7|8) \(|Fatal Python error: "
          r"(?:Segmentation|Bus|Illegal|Floating)"),
    _rule("aborted", TIMEOUT, r"terminate called (?:after throwing|without an active "
          r"exception)|Fatal Python error: Aborted"
          r"|SIGABRT|Signal 6 \(|Aborted \(core dumped\)"),
    _rule("scheduler_refusal", CAUSE, r"Batch job submission failed|Unable to allocate "
          r"resources|sbatch refused the job|Memory specification can not be satisfied"
          r"|Invalid generic resource \(gres\) specification"
          # a batch script's step asking for more than its job has (srun/launch.c); not
          # `Job/step already completing`: the job's end
          r"|Unable to create step for job \d+: (?!Job/step already completing)"),
    _rule("time_limit", CAUSE, r"DUE TO TIME LIMIT|(?<!CPU )[Tt]ime limit (?:reached|exceeded)"),
    _rule("node_failure", CAUSE, r"DUE TO NODE FAILURE|Node failure on|NODE_FAIL"
          r"|Communication connection failure|not responding, setting DOWN"),
    _rule("cancelled", CAUSE, SLURM_CANCELLED),  # after time_limit and node_failure's
    _rule("cascade", CASCADE, r"SIGTERM|Signal 15 \(|Terminated|Connection closed by peer"
          r"|Connection reset by peer|Broken pipe|communicator was aborted|has been aborted"
          r"|closing signal|SignalException|ChildFailedError|watchdog thread terminated"
          r"|remote process exited|Job step aborted|forcing job termination|Force Terminated"
          r"|_step_signal|KeyboardInterrupt"
          # horovod: a rank whose peer failed; horovodrun's summary of the first failure
          r"|Horovod has been shut down|Horovod detected that one or more processes exited"),
)  # fmt: skip

# What an environment build could not find (uv, pip, micromamba), for the summary.
PACKAGE_MISSING = re.compile(
    r"(?P<a>[\w.\-\[\]]+) was not found in the package registry|there is no version of "
    r"(?P<b>\S+?)(?:,| and |$)|No matching distribution found for (?P<c>\S+)"
    r"|nothing provides requested (?P<d>\S+)|satisfies the requirement (?P<e>\S+)"
)

# Lines that look like errors but are warnings or notes (never evidence of a cause).
BENIGN = re.compile(
    r"\bWARN(?:ING)?\b|Warning:|UserWarning|FutureWarning|DeprecationWarning|^\[?W\d{4} "
    r"|NCCL INFO|\bINFO\b|^\s*warnings\.warn"
)
# A line that reads like an error when no rule knows it (for the `unknown` evidence).
ERRORISH = re.compile(
    r"\b[Ee]rror\b|Exception\b|Traceback|\b[Ff]atal\b|\bFAILED\b|\b[Ff]ailed\b|\b[Ff]ailure\b"
    r"|\b[Kk]illed\b|\b[Aa]borted\b|[Ss]egmentation fault|timed out|[Cc]onnection refused"
    r"|unreachable|CANCELLED AT|exit(?:ed with exit)? code [1-9]|ERROR\b|No such file"
    r"|can't open file|No space left"
)
EXCEPTION_LINE = re.compile(
    r"^(?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception|Interrupt|Exit|Failure|Warning)\b(?::|$)"
)


def match(text: str, multi_host: bool | None = None) -> Rule | None:
    """The first rule whose pattern occurs in the line (loopback rules only across hosts)."""
    for rule in RULES:
        if rule.loopback and multi_host is False:
            continue
        if rule.pattern.search(text):
            return rule
    return None


def errorish(text: str) -> bool:
    """Looks like an error and is not a warning."""
    return bool(ERRORISH.search(text) or match(text)) and not BENIGN.search(text)
