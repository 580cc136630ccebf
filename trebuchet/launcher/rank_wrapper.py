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

from trebuchet.store.files import write_atomic

# Written to <run dir>/rank.sh; run as `bash <run dir>/rank.sh COMMAND...` once RANK,
# LOCAL_RANK and GROUP_RANK are set (by torchrun, or by the MPI prelude in plan.py).
RANK_SCRIPT = "rank.sh"
# Launchers with agents: trebuchet supervises the agent, each worker records itself.
AGENT_LAUNCHERS = ("torchrun", "mpirun", "horovod")
RANK_WRAPPER = r"""t_dir=$TREB_RUN_DIR/attempt-$TREB_ATTEMPT
exec >>"$t_dir/rank-$RANK.log" 2>&1 </dev/null
t_now() { local t=${EPOCHREALTIME:-}; [ -n "$t" ] || t=$(date +%s.%N); printf '%s' "${t/,/.}"; }
t_t0=$(t_now) t_stopped=false t_child= t_intr=
t_record() {  # t_record STATE [EXIT SIGNAL ENDED]
    local tmp="$t_dir/.rank-$RANK.json.$$"
    printf '%s\n' "{\"label\": \"$GROUP_RANK:$LOCAL_RANK\", \"rank\": $RANK, \
\"node\": $GROUP_RANK, \"local_rank\": $LOCAL_RANK, \"pid\": ${t_child:-null}, \
\"state\": \"$1\", \"exit_code\": ${2:-null}, \"signal\": ${3:-null}, \
\"started_at\": $t_t0, \"ended_at\": ${4:-null}, \"stopped_by_launcher\": $t_stopped}" \
        >"$tmp" &&
        mv -f "$tmp" "$t_dir/rank-$RANK.json"
}
t_pass() { t_intr=1; [ -z "$t_child" ] || kill -"$1" "$t_child" 2>/dev/null; }
trap 't_stopped=true; t_pass TERM' TERM  # the agent stops its workers: a cascade, not a cause
trap 't_stopped=true; t_pass TERM' INT  # (a background child ignores INT: TERM it)
trap 't_pass USR1' USR1
trap 't_pass USR2' USR2
"$@" &
t_child=$!
t_record RUNNING
while :; do  # the child's status, even when a forwarded signal cuts `wait` short
    t_intr=
    wait "$t_child"; t_rc=$?
    [ -n "$t_intr" ] || break
    if ! kill -0 "$t_child" 2>/dev/null; then
        wait "$t_child" && t_rc=0 || { t_r=$?; [ "$t_r" = 127 ] || t_rc=$t_r; }
        break
    fi
done
t_sig=null
if [ "$t_rc" -gt 128 ] && [ "$t_rc" -le 192 ]; then
    t_sig="\"SIG$(kill -l $((t_rc - 128)) 2>/dev/null)\""
fi
t_record ENDED "$t_rc" "$t_sig" "$(t_now)"
exit "$t_rc"
"""


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


def first_failed(records: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The earliest rank that ended non-zero on its own (not stopped by its launcher)."""
    failed = [
        r for r in records
        if r.get("exit_code") not in (None, 0) and not r.get("stopped_by_launcher")
    ]  # fmt: skip
    return min(failed, key=lambda r: r.get("ended_at") or 0.0) if failed else None
