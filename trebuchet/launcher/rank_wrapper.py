"""The per-rank wrapper under torchrun, mpirun and horovodrun, and the records it leaves.

Why: under those launchers trebuchet starts one agent per node (or one mpirun), and an
agent's exit code says only that some worker failed. Each worker therefore runs this small
bash wrapper: it sends the rank's output to its own log, runs the command as its child,
forwards the signals the rank must see (checkpoint USR1/USR2, and TERM/INT from the agent's
teardown), and writes the rank's outcome to `attempt-<n>/rank-<r>.json` (temp file, then
rename). The supervisor reads those records to name the rank that failed first, with its
exit code, and to tell it from the ranks the agent stopped afterwards.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from trebuchet.launcher.bash_helpers import HELPERS
from trebuchet.store.files import write_atomic

# Written to <run dir>/rank.sh; run as `bash <run dir>/rank.sh COMMAND...` once RANK,
# LOCAL_RANK and GROUP_RANK are set (by torchrun, or by the MPI prelude in plan.py).
RANK_SCRIPT = "rank.sh"
# Launchers with agents: trebuchet supervises the agent, each worker records itself.
AGENT_LAUNCHERS = ("torchrun", "mpirun", "horovod")
RANK_WRAPPER = (
    HELPERS
    + r"""t_dir=$TREB_RUN_DIR/attempt-$TREB_ATTEMPT
exec >>"$t_dir/rank-$RANK.log" 2>&1 </dev/null
t_t0=$(treb_now) t_stopped=false t_child=
t_record() {  # t_record STATE [EXIT SIGNAL ENDED]
    treb_put "$t_dir/rank-$RANK.json" "{\"label\": \"$GROUP_RANK:$LOCAL_RANK\", \
\"rank\": $RANK, \"node\": $GROUP_RANK, \"local_rank\": $LOCAL_RANK, \
\"pid\": ${t_child:-null}, \"state\": \"$1\", \"exit_code\": ${2:-null}, \
\"signal\": ${3:-null}, \"started_at\": $t_t0, \"ended_at\": ${4:-null}, \
\"stopped_by_launcher\": $t_stopped}"
}
t_pass() { treb_intr=1; [ -z "$t_child" ] || kill -"$1" "$t_child" 2>/dev/null; }
trap 't_stopped=true; t_pass TERM' TERM  # the agent stops its workers: a cascade, not a cause
trap 't_stopped=true; t_pass TERM' INT  # (a background child ignores INT: TERM it)
trap 't_pass USR1' USR1
trap 't_pass USR2' USR2
"$@" &
t_child=$!
t_record RUNNING
treb_wait "$t_child"  # the child's status, even when a forwarded signal cuts `wait` short
t_sig=null
if [ "$treb_rc" -gt 128 ] && [ "$treb_rc" -le 192 ]; then
    t_sig="\"SIG$(kill -l $((treb_rc - 128)) 2>/dev/null)\""
fi
t_record ENDED "$treb_rc" "$t_sig" "$(treb_now)"
exit "$treb_rc"
"""
)


def write_rank_script(run_dir: Path) -> None:
    write_atomic(run_dir / RANK_SCRIPT, RANK_WRAPPER)


def rank_records(attempt_dir: Path, node: int | None = None) -> list[dict[str, Any]]:
    """The wrappers' records of one attempt (of one node when given), by rank."""
    out = []
    for path in attempt_dir.glob("rank-*.json"):
        try:
            rec = json.loads(path.read_text())
        except (OSError, ValueError):  # never half written (renamed into place); gone
            continue
        if isinstance(rec, dict) and (node is None or rec.get("node") == node):
            rec["log"] = str(attempt_dir / f"rank-{rec.get('rank')}.log")
            out.append(rec)
    return sorted(out, key=lambda r: r.get("rank") or 0)
