#!/usr/bin/env bash
# A rank that costs almost nothing (bench/scale.py, bench/slurm_scale.py --scale): bash and
# its builtins only, so that 512 of them on 2 cores measure the launcher, not the ranks.
# It reports readiness as the file $STAMPS/<attempt>-<rank> ("<epoch seconds> <pid>",
# written then renamed), prints one line, and sleeps until told otherwise:
#   SIGUSR1  fail: exit 1 (a rank's failure)
#   SIGUSR2  hang: ignore SIGTERM from then on and keep sleeping (a rank that will not stop)
# Rank and attempt come from treb's contract (RANK, TREB_ATTEMPT) or srun's (SLURM_PROCID).
rank="${RANK:-${SLURM_PROCID:-0}}"
attempt="${TREB_ATTEMPT:-0}"
out="$STAMPS/$attempt-$rank"
printf '%s %s\n' "$EPOCHREALTIME" "$$" >"$out.tmp" && mv -f "$out.tmp" "$out"
echo "rank $rank of attempt $attempt ready on $(</proc/sys/kernel/hostname)"
child=
trap 'kill "$child" 2>/dev/null; echo "rank $rank failing" >&2; exit 1' USR1
trap 'trap "" TERM; echo "rank $rank hangs" >&2' USR2
trap 'kill "$child" 2>/dev/null; exit 143' TERM
# The sleep holds none of the rank's stdio and lasts 30 s: where the rank itself is SIGKILLed
# (Slurm's KillWait on a busy machine) before its trap ends it, an orphaned sleep that held
# the step's output open kept the step alive (slurmstepd "Abandoning IO", the node drained).
while :; do
    sleep 30 </dev/null >/dev/null 2>&1 &
    child=$!
    wait "$child"
done
