"""Bash functions shared by the scripts trebuchet runs around ranks: time, JSON, atomic
file writes, and a `wait` that survives trapped signals.

Why one copy: the Slurm runtime (slurm_runtime.py) and the local rank wrapper
(rank_wrapper.py) write outcome records the same way, and the subtle part (a child's exit
status when a trap cut `wait` short) must be right in one place.
"""

from __future__ import annotations

# Each script that uses them (Slurm batch script, Slurm task wrapper, rank.sh) has its own bash.
HELPERS = r"""treb_now() {  # epoch seconds with a fraction, without forking where bash allows
    local t=${EPOCHREALTIME:-}
    [ -n "$t" ] || t=$(date +%s.%N)
    printf '%s' "${t/,/.}"
}
treb_json() {  # a JSON string
    local s=$1
    s=${s//\\/\\\\}; s=${s//\"/\\\"}; s=${s//$'\n'/\\n}; s=${s//$'\r'/\\r}; s=${s//$'\t'/\\t}
    printf '"%s"' "$s"
}
treb_put() {  # treb_put FILE TEXT: readers see the old file or the new one, never half
    local tmp="${1%/*}/.${1##*/}.$$.$RANDOM.tmp"
    printf '%s\n' "$2" >"$tmp" && mv -f "$tmp" "$1"
}
treb_wait() {  # treb_wait PID: its exit status in treb_rc, even when traps interrupt wait
    local rc
    while :; do
        treb_intr=
        wait "$1"; rc=$?
        [ -n "$treb_intr" ] || break  # not cut short by one of our traps: the child's status
        if ! kill -0 "$1" 2>/dev/null; then
            # It ended around the signal: bash may still hold its status (or not, -1/127).
            wait "$1" && rc=0 || { local r=$?; [ "$r" -le 0 ] || [ "$r" = 127 ] || rc=$r; }
            break
        fi
    done
    [ "$rc" -ge 0 ] && [ "$rc" -le 255 ] || rc=255
    treb_rc=$rc
}
"""
