"""The static bash the sbatch script runs: attempts, signals, per-rank wrapper and records.

Why static text: every value from the spec is rendered above it as one quoted shell word
(slurm_script.py), so nothing a user writes can change what this code does. The job
writes its own records (rank outcomes, attempt and result files, atomically: temp file
then rename) into the run directory on the shared filesystem, so trebuchet knows the root
cause and the end state without sacct.

Files the job writes (all under $TREB_RUN_DIR):
  batch.log                        the batch script's output (Slurm's --output)
  attempt-<n>/attempt.json         state, reason, start/end of attempt n
  attempt-<n>/rank-<r>.{log,json}  a rank's output and outcome (native, torchrun, mpirun)
  attempt-<n>/node-<k>.{log,json}  a node agent's (torchrun, none; mpirun: node-0 only)
  attempt-<n>/{pre,post}-node-<k>.log
  attempt-<n>/teardown             which rank's failure stopped the step (a marker)
  result.json                      the run's end as the job saw it
"""

from __future__ import annotations

# One Slurm task (mode "task"), one torchrun worker (mode "rank") or one pre/post command
# per node (mode "pre"/"post"). Passed to srun as `bash -c "$TREB_TASK_SH" treb-task MODE
# COMMAND...`, so the command reaches the node as argv and only the node's bash expands it.
TASK = r"""treb_mode=$1; shift
treb_t0=$(treb_now)
treb_rank=null treb_local=null treb_node=${SLURM_NODEID:-0}
if [ "$treb_mode" = mpi ]; then  # an mpirun rank: OpenMPI's variables onto the contract
    # (mpirun --map-by slot fills the first host's slots first: the node is RANK / PPN)
    export RANK=$OMPI_COMM_WORLD_RANK WORLD_SIZE=$OMPI_COMM_WORLD_SIZE \
        LOCAL_RANK=$OMPI_COMM_WORLD_LOCAL_RANK LOCAL_WORLD_SIZE=$OMPI_COMM_WORLD_LOCAL_SIZE \
        ROLE_RANK=$OMPI_COMM_WORLD_RANK ROLE_WORLD_SIZE=$OMPI_COMM_WORLD_SIZE \
        GROUP_WORLD_SIZE=$NUM_NODES
    export NODE_RANK=$((RANK / TREB_PPN)) GROUP_RANK=$((RANK / TREB_PPN))
    treb_mode=rank  # from here on like a torchrun worker: its launcher stops it
fi
case $treb_mode in
rank)  # a torchrun worker: torchrun set RANK, LOCAL_RANK, GROUP_RANK
    treb_rank=$RANK treb_local=$LOCAL_RANK treb_node=$GROUP_RANK
    treb_name=rank-$RANK treb_label=$GROUP_RANK:$LOCAL_RANK ;;
pre|post)
    export NODE_RANK=$treb_node GROUP_RANK=$treb_node NUM_NODES=$SLURM_NNODES \
        LOCAL_WORLD_SIZE=$TREB_PPN
    treb_name=$treb_mode-node-$treb_node treb_label=$treb_mode:$treb_node ;;
task)
    export NODE_RANK=$treb_node GROUP_RANK=$treb_node NUM_NODES=$SLURM_NNODES
    if [ "$TREB_LAUNCHER" != none ] && [ -z "${OMP_NUM_THREADS:-}" ]; then
        treb_cpus=${SLURM_CPUS_ON_NODE:-$(nproc)}
        treb_cpus=$((treb_cpus / TREB_PPN))
        export OMP_NUM_THREADS=$((treb_cpus > 0 ? treb_cpus : 1))
    fi
    case $TREB_LAUNCHER in
    native)
        export RANK=$SLURM_PROCID LOCAL_RANK=$SLURM_LOCALID WORLD_SIZE=$SLURM_NTASKS \
            LOCAL_WORLD_SIZE=$TREB_PPN GROUP_WORLD_SIZE=$SLURM_NNODES ROLE_RANK=$SLURM_PROCID \
            ROLE_WORLD_SIZE=$SLURM_NTASKS
        treb_rank=$RANK treb_local=$LOCAL_RANK
        treb_name=rank-$RANK treb_label=$treb_node:$LOCAL_RANK ;;
    torchrun)  # one agent per node; every worker runs this same wrapper in mode "rank"
        treb_name=node-$treb_node treb_label=$treb_node
        set -- torchrun --nnodes "$SLURM_NNODES" --node_rank "$treb_node" \
            --nproc_per_node "$TREB_PPN" --master_addr "$MASTER_ADDR" \
            --master_port "$MASTER_PORT" --no-python \
            bash -c "$TREB_TASK_SH" treb-rank rank "$@" ;;
    mpirun)  # one task on the first node; mpirun starts OpenMPI's daemons on the others
        # through Slurm (a step of this job) and every rank runs this wrapper in mode "mpi"
        export NUM_NODES=$SLURM_JOB_NUM_NODES LOCAL_WORLD_SIZE=$TREB_PPN
        # OpenMPI reads the allocation from these: this one-task step's values would give it
        # one slot on one node. With the job's, it sees P slots on every node and starts its
        # daemons with `srun --nodes=N-1 --nodelist=<the other nodes>` (plm slurm).
        export SLURM_NODELIST=$SLURM_JOB_NODELIST SLURM_TASKS_PER_NODE="$TREB_PPN(x$NUM_NODES)"
        treb_name=node-$treb_node treb_label=$treb_node
        treb_hl= treb_x=()
        for treb_h in $(scontrol show hostnames "$SLURM_JOB_NODELIST"); do
            treb_hl=$treb_hl${treb_hl:+,}$treb_h:$TREB_PPN
        done
        [ "$(id -u)" != 0 ] || export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
        for treb_v in PATH MASTER_ADDR MASTER_PORT NUM_NODES LOCAL_WORLD_SIZE OMP_NUM_THREADS \
            PYTHONUNBUFFERED TREB_RUN_ID TREB_RUN_DIR TREB_WORKDIR TREB_LAUNCHER TREB_PPN \
            TREB_GRACE TREB_CHECKPOINT_SIGNAL TREB_CHECKPOINT_DIR TREB_ATTEMPT TREB_TASK_SH \
            $TREB_MPI_ENV; do  # mpirun passes variables to remote ranks only with -x
            [ -z "${!treb_v+x}" ] || treb_x+=(-x "$treb_v")
        done
        # When a rank fails, OpenMPI sends SIGTERM to the others, then SIGKILL after
        # odls_base_sigkill_timeout (1 s by default): grace_period instead, so that each
        # wrapper has the time to record its rank as stopped by the launcher.
        set -- mpirun -np $((NUM_NODES * TREB_PPN)) -H "$treb_hl" --bind-to none \
            --map-by slot --mca odls_base_sigkill_timeout "$TREB_GRACE" "${treb_x[@]}" \
            bash -c "$TREB_TASK_SH" treb-rank mpi "$@" ;;
    *)  # none: the user's own launcher, once per node
        export LOCAL_WORLD_SIZE=$TREB_PPN
        treb_name=node-$treb_node treb_label=$treb_node ;;
    esac ;;
esac
treb_host=$(hostname 2>/dev/null) || treb_host=${SLURMD_NODENAME:-unknown}
treb_out=$TREB_RUN_DIR/attempt-$TREB_ATTEMPT/$treb_name
exec >>"$treb_out.log" 2>&1 </dev/null
treb_stopped=false treb_child= treb_killer=
treb_record() {  # treb_record STATE [EXIT SIGNAL ENDED]
    case $treb_mode in pre|post) return 0 ;; esac  # their log is their record
    treb_put "$treb_out.json" "{\"label\": \"$treb_label\", \"rank\": $treb_rank, \
\"node\": $treb_node, \"local_rank\": $treb_local, \"host\": $(treb_json "$treb_host"), \
\"pid\": ${treb_child:-null}, \"state\": \"$1\", \"exit_code\": ${2:-null}, \
\"signal\": ${3:-null}, \"started_at\": $treb_t0, \"ended_at\": ${4:-null}, \
\"stopped_by_launcher\": $treb_stopped, \"attempt\": $TREB_ATTEMPT, \
\"job_id\": \"$SLURM_JOB_ID\", \"step_id\": \"${SLURM_STEP_ID:-}\", \
\"log\": $(treb_json "$treb_out.log")}"
}
treb_on_term() {  # stopped by Slurm or by the teardown after another rank failed
    treb_intr=1 treb_stopped=true
    [ -n "$treb_child" ] && kill -0 "$treb_child" 2>/dev/null || return 0
    # Slurm signals every process of the step; a torchrun worker's TERM comes from its agent.
    [ "$treb_mode" != rank ] || kill -TERM "$treb_child" 2>/dev/null
    if [ -z "$treb_killer" ]; then
        ( trap '' TERM; sleep "$TREB_GRACE"; kill -KILL "$treb_child" 2>/dev/null ) &
        treb_killer=$!
        disown "$treb_killer"  # no "Killed" line in the log when it is no longer needed
    fi
}
trap treb_on_term TERM
treb_stopped_elsewhere() {  # the command died of a stop signal sent to the whole step
    # Slurm signals a step's processes one by one (children first with proctrack/linuxproc):
    # the command can die before this wrapper's own TERM arrives, so look at why.
    case $treb_rc in 129|130|137|143) ;; *) return 1 ;; esac
    [ ! -e "$TREB_RUN_DIR/cancel-requested" ] || return 0
    [ ! -e "$TREB_RUN_DIR/attempt-$TREB_ATTEMPT/teardown" ] || return 0
    local st; st=$(squeue -h -j "$SLURM_JOB_ID" -o %T 2>/dev/null) || return 1
    [ -n "$st" ] && [ "$st" != RUNNING ]  # cancelled, time limit, preempted: ending
}
treb_sig=${TREB_CHECKPOINT_SIGNAL#SIG}
if [ "$treb_mode" = task ] && [ "$TREB_LAUNCHER" = torchrun ]; then
    # torchrun dies of USR1/USR2 (it handles TERM, INT, HUP, QUIT only): it ignores the
    # checkpoint signal, and each worker's wrapper restores it for the command (below).
    trap '' "$treb_sig"
elif [ "$treb_mode" = rank ]; then
    if command -v python3 >/dev/null 2>&1; then
        set -- python3 -c 'import os, signal, sys
signal.signal(getattr(signal, sys.argv[1]), signal.SIG_DFL)
os.execvp(sys.argv[2], sys.argv[2:])' "SIG$treb_sig" "$@"
    fi
else
    trap 'treb_intr=1' "$treb_sig"  # the wrapper survives; the command gets it from Slurm
fi
cd "$TREB_WORKDIR" || exit 2
"$@" &
treb_child=$!
treb_record RUNNING
treb_wait "$treb_child"
[ -z "$treb_killer" ] || kill -KILL "$treb_killer" 2>/dev/null
treb_signal=null
if [ "$treb_rc" -gt 128 ] && [ "$treb_rc" -le 192 ]; then
    treb_signal="\"SIG$(kill -l $((treb_rc - 128)) 2>/dev/null)\""
fi
[ "$treb_stopped" = true ] || ! treb_stopped_elsewhere || treb_stopped=true
treb_record ENDED "$treb_rc" "$treb_signal" "$(treb_now)"
if [ "$treb_rc" != 0 ] && [ "$treb_stopped" = false ] && [ "$treb_mode" = task ]; then
    # The first failure stops the other tasks of this step: SIGTERM now, each wrapper
    # sends SIGKILL after the grace period (srun would otherwise wait for them forever).
    # The marker tells the wrappers whose command dies before their own TERM arrives.
    treb_put "$TREB_RUN_DIR/attempt-$TREB_ATTEMPT/teardown" "$treb_label"
    ( trap '' TERM; exec scancel --signal=TERM "$SLURM_JOB_ID.$SLURM_STEP_ID" 2>/dev/null )
fi
exit "$treb_rc"
"""

# The batch script's functions and signal traps (before the user's env and setup lines).
BATCH_FUNCS = r"""treb_log() { printf '[treb %(%H:%M:%S)T] %s\n' -1 "$*"; }
treb_attempt=0 treb_adir= treb_t0=null treb_srun= treb_srun_rc=null treb_rc=0
treb_warned= treb_requeued= treb_terminating= treb_timer= treb_state= treb_reason=
treb_sig=${TREB_CHECKPOINT_SIGNAL#SIG}
treb_attempt_json() {  # treb_attempt_json STATE REASON ENDED SOURCE
    treb_put "$treb_adir/attempt.json" "{\"attempt\": $treb_attempt, \"state\": \"$1\", \
\"reason\": $(treb_json "$2"), \"started_at\": $treb_t0, \"ended_at\": ${3:-null}, \
\"source\": \"$4\", \"job_id\": \"$SLURM_JOB_ID\", \
\"restart_count\": ${SLURM_RESTART_COUNT:-0}, \"nodes\": $(treb_json "$SLURM_JOB_NODELIST"), \
\"master\": $(treb_json "$MASTER_ADDR:$MASTER_PORT"), \"srun_exit\": $treb_srun_rc, \
\"max_attempts\": $(treb_max)}"
}
treb_max() {  # attempts allowed: retries + 1, plus those the log policies granted so far
    local granted=0
    [ ! -f "$TREB_RUN_DIR/policy-retries" ] || granted=$(wc -l <"$TREB_RUN_DIR/policy-retries")
    echo $((TREB_MAX_ATTEMPTS + granted))
}
treb_policy() {  # the first log policy whose pattern is in the attempt's logs (as locally)
    local i f line rc
    treb_pol= treb_pol_line=
    for i in ${TREB_POLICY_RX[@]+"${!TREB_POLICY_RX[@]}"}; do
        for f in "$treb_adir"/rank-*.log "$treb_adir"/node-*.log; do
            [ -f "$f" ] || continue
            # the end of the log holds the error; grep -P: Perl regexes, close to Python's
            line=$(tail -c 4194304 "$f" | grep -m1 -P -e "${TREB_POLICY_RX[$i]}" 2>&1)
            rc=$?
            if [ "$rc" = 0 ]; then
                treb_pol=$i treb_pol_line=${line:0:300}
                return 0
            elif [ "$rc" != 1 ]; then
                treb_log "log policy ${TREB_POLICY_NAMES[$i]}: grep -P cannot use its pattern \
here, skipped: $line"
                break
            fi
        done
    done
    return 1
}
treb_apply_policy() {  # after a failed attempt: 0 retry granted, 1 final, 2 no match,
    # 3 a retry policy matched but has granted all it may (the spec's retries decide)
    treb_policy || return 2
    local name=${TREB_POLICY_NAMES[$treb_pol]} action=${TREB_POLICY_ACTIONS[$treb_pol]} used=0
    treb_log "log policy $name ($action) matched: $treb_pol_line"
    printf '%s\n' "{\"time\": $(treb_now), \"event\": \"log_policy\", \"attempt\": $treb_attempt, \
\"policy\": $(treb_json "$name"), \"action\": \"$action\", \
\"line\": $(treb_json "$treb_pol_line")}" >>"$TREB_RUN_DIR/events.jsonl"
    treb_reason="$name: $action"
    [ "$action" = retry ] || return 1
    [ ! -f "$TREB_RUN_DIR/policy-retries" ] ||
        used=$(grep -c -x -F -e "$name" "$TREB_RUN_DIR/policy-retries")
    [ "$used" -lt "${TREB_POLICY_MAX[$treb_pol]}" ] || return 3
    printf '%s\n' "$name" >>"$TREB_RUN_DIR/policy-retries"
    return 0
}
treb_result() {  # treb_result STATE REASON SOURCE
    treb_put "$TREB_RUN_DIR/result.json" "{\"state\": \"$1\", \"reason\": $(treb_json "$2"), \
\"source\": \"$3\", \"attempt\": $treb_attempt, \"exit_code\": $treb_srun_rc, \
\"ended_at\": $(treb_now), \"job_id\": \"$SLURM_JOB_ID\"}"
}
treb_die() {  # the job cannot start: say why where `treb status` finds it
    treb_log "error: $*"
    treb_result FAILED "$*" batch
    exit 2
}
treb_time_left() {  # seconds until the job's time limit (squeue %L: [D-][H:]M:S)
    local left d=0 h=0 m=0 s=0
    left=$(squeue -h -j "$SLURM_JOB_ID" -o %L 2>/dev/null) || left=
    case $left in *-*) d=${left%%-*}; left=${left#*-} ;; esac
    IFS=: read -r h m s <<<"$left"
    [ -n "$s" ] || { s=$m; m=$h; h=0; }
    [ -n "$s" ] || { s=$m; m=0; }
    case "$d$h$m$s" in *[!0-9]*|'') echo 0; return ;; esac
    echo $((10#$d * 86400 + 10#$h * 3600 + 10#$m * 60 + 10#$s))
}
treb_on_warning() {  # Slurm's --signal=B:SIG@warning: ask every rank to checkpoint
    treb_intr=1
    [ -z "$treb_warned" ] || return 0
    treb_warned=1
    treb_log "time limit near: SIG$treb_sig to every rank (checkpoint now)"
    scancel --signal="$treb_sig" "$SLURM_JOB_ID" || treb_log "scancel --signal failed"
    if [ $((treb_attempt + 1)) -lt "$(treb_max)" ] && [ -n "$treb_srun" ]; then
        local left; left=$(treb_time_left)
        left=$((left > TREB_REQUEUE_MARGIN + 1 ? left - TREB_REQUEUE_MARGIN : 1))
        treb_log "requeueing when the ranks stop, at the latest in ${left}s"
        ( trap '' TERM; sleep "$left"; kill -ALRM $$ ) &
        treb_timer=$!
        disown "$treb_timer"
    fi
}
treb_requeue() {  # a new allocation (and time limit) for the next attempt, same job id
    treb_requeued=1
    treb_attempt_json TIMEOUT "time limit: SIG$treb_sig sent, job requeued for attempt \
$((treb_attempt + 1))" "$(treb_now)" batch
    treb_log "requeueing job $SLURM_JOB_ID for attempt $((treb_attempt + 1))"
    if scontrol requeue "$SLURM_JOB_ID"; then
        sleep 600 & wait $!  # Slurm ends this script; the next start picks the next attempt
        exit 0
    fi
    treb_requeued=
    treb_log "scontrol requeue failed: no further attempt"
    treb_attempt_json TIMEOUT "time limit (requeue failed)" "$(treb_now)" batch
}
treb_on_term() {  # cancelled, time limit, preemption, requeue: record why, at once
    treb_intr=1
    [ -z "$treb_requeued" ] && [ -z "$treb_terminating" ] || return 0
    treb_terminating=1
    local info
    treb_state=CANCELLED
    if [ -e "$TREB_RUN_DIR/cancel-requested" ]; then
        treb_reason="cancelled (treb cancel)"
    else
        info=$(squeue -h -j "$SLURM_JOB_ID" -o '%T %r' 2>/dev/null)
        if [ "${info#*TimeLimit}" != "$info" ] || { [ -z "$info" ] && [ -n "$treb_warned" ]; }
        then
            treb_state=TIMEOUT treb_reason="time limit"
        else
            treb_reason="stopped by Slurm (${info:-state unknown}): scancel, preemption or \
node failure"
        fi
    fi
    treb_log "$treb_reason"
    [ -z "$treb_adir" ] || treb_attempt_json "$treb_state" "$treb_reason" "$(treb_now)" signal
    treb_result "$treb_state" "$treb_reason" signal
}
treb_on_alarm() { treb_intr=1; [ -n "$treb_srun" ] && [ -z "$treb_terminating" ] && treb_requeue; }
treb_hooks() {  # treb_hooks pre|post: the spec's command once per node
    local cmd=$1 rc
    [ "$1" = pre ] && cmd=$TREB_PRE || cmd=$TREB_POST
    [ -n "$cmd" ] || return 0
    srun "${TREB_SRUN_HOOK[@]}" bash -c "$TREB_TASK_SH" treb-task "$1" bash -c "$cmd" </dev/null &
    treb_srun=$!
    treb_wait "$treb_srun"; rc=$treb_rc; treb_srun=
    [ "$rc" = 0 ] || treb_log "$1 command failed on a node (exit $rc): see $treb_adir/$1-node-*.log"
    return "$rc"
}
treb_run_attempt() {
    treb_adir=$TREB_RUN_DIR/attempt-$treb_attempt
    mkdir -p "$treb_adir"
    export TREB_ATTEMPT=$treb_attempt
    treb_t0=$(treb_now) treb_srun_rc=null
    treb_attempt_json RUNNING "" "" batch
    treb_log "attempt $treb_attempt (of $(treb_max)): $TREB_NODES node(s) \
$SLURM_JOB_NODELIST, master $MASTER_ADDR:$MASTER_PORT"
    if ! treb_hooks pre; then
        treb_state=FAILED treb_reason=pre
    else
        srun "${TREB_SRUN[@]}" bash -c "$TREB_TASK_SH" treb-task task "${TREB_CMD[@]}" </dev/null &
        treb_srun=$!
        treb_wait "$treb_srun"; treb_srun_rc=$treb_rc; treb_srun=
        [ -z "$treb_timer" ] || { kill -KILL "$treb_timer" 2>/dev/null; treb_timer=; }
        [ -z "$treb_terminating" ] || return 0
        if [ "$treb_srun_rc" = 0 ]; then
            treb_state=SUCCEEDED treb_reason=
        elif [ -n "$treb_warned" ]; then
            treb_state=TIMEOUT treb_reason="time limit: ranks stopped after SIG$treb_sig"
        else
            treb_state=FAILED treb_reason="srun exited with code $treb_srun_rc"
        fi
        if ! treb_hooks post && [ "$treb_state" = SUCCEEDED ]; then
            treb_state=FAILED treb_reason=post
        fi
    fi
    [ -z "$treb_terminating" ] || return 0
    treb_attempt_json "$treb_state" "$treb_reason" "$(treb_now)" batch
}
trap treb_on_warning "$treb_sig"
trap treb_on_term TERM
trap treb_on_alarm ALRM
"""

# After the user's env and slurm.setup lines: the attempts.
MAIN = r"""# The attempt to run: the next one after those already in the run directory (a requeued
# job starts again from the top of this script).
while [ -d "$TREB_RUN_DIR/attempt-$treb_attempt" ]; do treb_attempt=$((treb_attempt + 1)); done
if [ "$treb_attempt" -gt 0 ]; then
    treb_adir=$TREB_RUN_DIR/attempt-$((treb_attempt - 1))
    # Ended while running (no record, or the guess of the SIGTERM trap): this restart
    # shows that Slurm requeued the job.
    if grep -q -e '"state": "RUNNING"' -e '"source": "signal"' "$treb_adir/attempt.json" \
        2>/dev/null; then
        treb_attempt=$((treb_attempt - 1))
        treb_t0=$(sed -n 's/.*"started_at": \([0-9.]*\).*/\1/p' "$treb_adir/attempt.json")
        treb_attempt_json FAILED "requeued by Slurm (preemption, node failure or scontrol \
requeue)" "$(treb_now)" batch
        treb_attempt=$((treb_attempt + 1))
    fi
    rm -f "$TREB_RUN_DIR/result.json" "$TREB_RUN_DIR/cancel-requested"
    treb_log "job $SLURM_JOB_ID restarted (restart ${SLURM_RESTART_COUNT:-0})"
    if [ "$treb_attempt" -ge "$(treb_max)" ]; then
        treb_result FAILED "requeued after attempt $((treb_attempt - 1)), but no attempt is \
left (retries: $((TREB_MAX_ATTEMPTS - 1)))" batch
        exit 1
    fi
fi
while :; do
    treb_run_attempt
    [ -z "$treb_terminating" ] || break
    case $treb_state in
    TIMEOUT)
        [ $((treb_attempt + 1)) -ge "$(treb_max)" ] || treb_requeue
        break ;;
    FAILED)
        treb_policy_rc=2
        if [ -z "$treb_warned" ] && [ "$treb_reason" != pre ] && [ "$treb_reason" != post ]; then
            treb_apply_policy; treb_policy_rc=$?
            [ "$treb_policy_rc" = 2 ] ||
                treb_attempt_json FAILED "$treb_reason" "$(treb_now)" batch
        fi
        if [ "$treb_policy_rc" = 0 ] || { [ "$treb_policy_rc" != 1 ] && [ -z "$treb_warned" ] &&
            [ $((treb_attempt + 1)) -lt "$(treb_max)" ]; }; then
            treb_log "attempt $treb_attempt failed ($treb_reason): retrying"
            treb_attempt=$((treb_attempt + 1))
            continue
        fi
        break ;;
    *) break ;;
    esac
done
if [ -n "$treb_terminating" ]; then
    [ -z "$treb_srun" ] || treb_wait "$treb_srun"
    exit 143
fi
treb_result "$treb_state" "$treb_reason" batch
treb_log "run $TREB_RUN_ID: $treb_state${treb_reason:+ ($treb_reason)}"
[ "$treb_state" = SUCCEEDED ]
"""

# Before the user's env and setup: checks, the rendezvous address, trebuchet's variables.
PRELUDE = r"""export TREB_RUN_ID TREB_RUN_DIR TREB_WORKDIR TREB_LAUNCHER TREB_PPN TREB_GRACE
export TREB_CHECKPOINT_SIGNAL TREB_TASK_SH TREB_MPI_ENV
export TREB_CHECKPOINT_DIR="$TREB_RUN_DIR/checkpoints" PYTHONUNBUFFERED=1
[ -d "$TREB_RUN_DIR" ] || { echo "treb: run dir $TREB_RUN_DIR not found on $(hostname) \
(TREB_HOME must be on a filesystem every node shares)" >&2; exit 2; }
cd "$TREB_WORKDIR" 2>/dev/null || treb_die "cannot enter the workdir $TREB_WORKDIR on $(hostname)"
for treb_s in ${TREB_SECRETS[@]+"${TREB_SECRETS[@]}"}; do
    [ -n "${!treb_s+x}" ] || treb_die "secret $treb_s is not in the job's environment \
(sbatch exports the submitting environment; was it set there?)"
done
# The first node is the master; the port comes from the job id (the formula of
# trebuchet.dist.init_env), so two jobs sharing a node do not collide.
treb_hosts=$(scontrol show hostnames "$SLURM_JOB_NODELIST") || treb_die "scontrol failed"
export MASTER_ADDR=${treb_hosts%%$'\n'*}
export MASTER_PORT=${TREB_MASTER_PORT:-$((15000 + SLURM_JOB_ID % 10000))}
"""
