#!/usr/bin/env bash
# A real multi-node Slurm cluster (8 nodes by default) on this one machine, for
# integration tests and CI.
#
#   cluster.sh install   apt-get install slurm-wlm munge iproute2 libpmix-dev (skipped
#                        when present)
#   cluster.sh up        start it (idempotent: returns at once when already healthy)
#   cluster.sh down      stop it and undo every change it made (idempotent)
#   cluster.sh status    print sinfo; exit 0 when healthy, 1 otherwise
#   cluster.sh env       print the `export SLURM_CONF=...` line the client commands need
#   cluster.sh logs      print the daemons' logs
#
# Layout: the controller (slurmctld) runs in the root network namespace and listens on a
# bridge (trebbr0, 10.77.0.1/24). Each compute node tn1..tnN is a network namespace (tn1,
# tn2, ...) with its own address (10.77.0.11, .12, ...), joined to the bridge by a veth
# pair, and its own UTS namespace so that `hostname` prints the node name. The filesystem
# is shared (it is this machine's), so a file a job writes on tn1 is visible on tn2 and
# here. Partitions: `debug` (the default) over tn1,tn2, `big` over all N nodes.
#
# Needs root, Debian 12 (slurm-wlm 22.05). See README.md beside this file.
#
# Environment (all optional):
#   TREB_SLURM_DIR      per-cluster folder: config, state, spool, pid files, logs
#                       (default /var/tmp/treb-slurm)
#   TREB_SLURM_NET      first three octets of the private /24 used inside the namespaces
#                       (default 10.77.0)
#   TREB_SLURM_NODES    number of compute nodes, 2..99 (default 8)
#   TREB_SLURM_CPUS     CPUs each node declares, whatever the machine has (default 8)
#   TREB_SLURM_TIMEOUT  seconds `up` waits for all nodes to be idle (default 60)
#   TREB_SLURM_FAKE_GPUS  N > 0: each node offers N fake GPUs (gres gpu, backed by empty
#                       files) so that --gpus-per-node jobs can be scheduled (default 0)
#   TREB_SLURM_DEBUG    SlurmctldDebug/SlurmdDebug level (default info)
# `up` on a healthy cluster whose slurm.conf would come out different (other settings)
# rebuilds it; otherwise it returns at once.
set -euo pipefail

DIR="${TREB_SLURM_DIR:-/var/tmp/treb-slurm}"
NET="${TREB_SLURM_NET:-10.77.0}"
TIMEOUT="${TREB_SLURM_TIMEOUT:-60}"
FAKE_GPUS="${TREB_SLURM_FAKE_GPUS:-0}"
NNODES="${TREB_SLURM_NODES:-8}"
CPUS="${TREB_SLURM_CPUS:-8}"
need_number() { case "$2" in ''|*[!0-9]*) echo "$1 must be a number" >&2; exit 2 ;; esac; }
need_number TREB_SLURM_FAKE_GPUS "$FAKE_GPUS"
need_number TREB_SLURM_NODES "$NNODES"
need_number TREB_SLURM_CPUS "$CPUS"
if [ "$NNODES" -lt 2 ] || [ "$NNODES" -gt 99 ]; then
    echo "TREB_SLURM_NODES must be 2..99 (the default partition is tn1,tn2)" >&2; exit 2
fi
[ "$CPUS" -ge 1 ] || { echo "TREB_SLURM_CPUS must be >= 1" >&2; exit 2; }
CLUSTER=treb-test
BRIDGE=trebbr0
BRIDGE_IP="$NET.1"
NODES=()
declare -A NODE_IP=()
for ((i = 1; i <= NNODES; i++)); do NODES+=("tn$i"); NODE_IP[tn$i]="$NET.$((10 + i))"; done
HOSTS_BEGIN="# BEGIN trebuchet slurm test cluster ($DIR)"
HOSTS_END="# END trebuchet slurm test cluster ($DIR)"

CONF="$DIR/etc/slurm.conf"
RUN="$DIR/run"
LOG="$DIR/log"
STATE="$DIR/state"
SPOOL="$DIR/spool"
MUNGE_OURS="$RUN/munged.ours"       # holds the pid of the munged that `up` started
NODES_UP="$RUN/nodes"               # the nodes `up` started (`down` also stops these)
MUNGE_PIDFILE=/run/munge/munged.pid

export SLURM_CONF="$CONF"

log() { echo "[treb-slurm] $*" >&2; }
die() { log "ERROR: $*"; exit 1; }

need_root() { [ "$(id -u)" = 0 ] || die "must run as root"; }

case "$DIR" in
    /|"") die "TREB_SLURM_DIR must not be empty or /" ;;
    /*) ;;
    *) die "TREB_SLURM_DIR must be an absolute path" ;;
esac

veth_host() { echo "treb-$1"; }     # root-namespace end of a node's veth pair

# The configured nodes plus any an earlier `up` started with another TREB_SLURM_NODES,
# so that `down` (and a rebuilding `up`) leave no namespace, veth or slurmd behind.
all_nodes() {
    { printf '%s\n' "${NODES[@]}"; [ ! -f "$NODES_UP" ] || cat "$NODES_UP"; } | awk 'NF && !seen[$0]++'
}
# The nodes of the running cluster (so `status` needs no TREB_SLURM_NODES); `up` compares
# slurm.conf, which names the nodes, to see whether the running cluster is the one asked for.
started_nodes() {
    if [ -s "$NODES_UP" ]; then cat "$NODES_UP"; else printf '%s\n' "${NODES[@]}"; fi
}

# ---------------------------------------------------------------------------- pids
# A pid counts only if the process is alive and is the program we expect (guards
# against a stale pid file whose pid was reused by something else).
pid_alive() {   # pid_alive PID COMM   (a zombie counts as dead)
    local pid="$1" comm="$2" stat
    [ -n "$pid" ] && [ -d "/proc/$pid" ] || return 1
    [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$comm" ] || return 1
    stat="$(cat "/proc/$pid/stat" 2>/dev/null)" || return 1
    stat="${stat##*) }"
    [ "${stat%% *}" != Z ]
}
pid_from() { if [ -s "$1" ]; then tr -dc 0-9 <"$1"; fi; }

stop_pids() {   # stop_pids COMM PID...: SIGTERM all, wait up to 10 s, then SIGKILL
    local comm="$1" pid i left; shift
    for pid in "$@"; do
        ! pid_alive "$pid" "$comm" || kill -TERM "$pid" 2>/dev/null || true
    done
    for i in $(seq 1 100); do
        left=""
        for pid in "$@"; do ! pid_alive "$pid" "$comm" || left="$left $pid"; done
        [ -n "$left" ] || return 0
        sleep 0.1
    done
    log "$comm ($left ) did not stop on SIGTERM; sending SIGKILL"
    for pid in $left; do kill -KILL "$pid" 2>/dev/null || true; done
    sleep 0.2
}

# ---------------------------------------------------------------------------- install
is_installed() {
    local p
    for p in slurm-wlm munge iproute2 libpmix-dev; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || return 1
    done
    command -v nsenter >/dev/null && command -v unshare >/dev/null && command -v flock >/dev/null
}

cmd_install() {
    need_root
    if is_installed; then log "slurm-wlm, munge, iproute2, libpmix-dev already installed"; return 0; fi
    export DEBIAN_FRONTEND=noninteractive
    # An old or missing package list makes the install fail: refresh once.
    apt-get update -qq
    apt-get install -y -qq slurm-wlm munge iproute2 util-linux >/dev/null
    # libpmix.so (only in the -dev package) is what Debian's mpi/pmix plugin loads:
    # without it `srun --mpi=pmix` fails with "can not load PMIx library".
    apt-get install -y -qq --no-install-recommends libpmix-dev >/dev/null
    is_installed || die "install failed"
    log "installed: $(slurmctld -V)"
}

# ---------------------------------------------------------------------------- munge
munge_ok() {
    [ -S /run/munge/munge.socket.2 ] || return 1   # no socket: skip munge's retries
    munge -n 2>/dev/null | unmunge >/dev/null 2>&1
}

munge_up() {
    if munge_ok; then return 0; fi
    # Not working: is there a munged at all? Never start a second one (it would steal
    # the socket and remove it when it ends).
    local pid; pid="$(pid_from "$MUNGE_PIDFILE")"
    if pid_alive "$pid" munged; then
        die "a munged (pid $pid) is running but 'munge -n | unmunge' fails; fix or stop it"
    fi
    if [ ! -s /etc/munge/munge.key ]; then
        log "creating /etc/munge/munge.key"
        install -d -o munge -g munge -m 700 /etc/munge
        dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
        chown munge:munge /etc/munge/munge.key
        chmod 400 /etc/munge/munge.key
    fi
    install -d -o munge -g munge -m 755 /run/munge
    install -d -o munge -g munge -m 700 /var/lib/munge /var/log/munge
    runuser -u munge -- munged --force 9>&-
    local i
    for i in $(seq 1 50); do munge_ok && break; sleep 0.1; done
    munge_ok || die "munged did not come up (see /var/log/munge/munged.log)"
    pid="$(pid_from "$MUNGE_PIDFILE")"
    echo "$pid" >"$MUNGE_OURS"
    log "started munged (pid $pid)"
}

munge_down() {  # only the munged that `up` started
    [ -f "$MUNGE_OURS" ] || return 0
    local pid; pid="$(pid_from "$MUNGE_OURS")"
    if [ -n "$pid" ] && [ "$(pid_from "$MUNGE_PIDFILE")" = "$pid" ]; then
        stop_pids munged "$pid"
        log "stopped munged (pid $pid)"
    fi
    rm -f "$MUNGE_OURS"
}

# ---------------------------------------------------------------------------- network
net_up() {
    if ! ip link show "$BRIDGE" >/dev/null 2>&1; then
        ip link add "$BRIDGE" type bridge
    fi
    ip addr replace "$BRIDGE_IP/24" dev "$BRIDGE"
    ip link set "$BRIDGE" up
    local n vh
    for n in "${NODES[@]}"; do
        vh="$(veth_host "$n")"
        [ -e "/var/run/netns/$n" ] || ip netns add "$n"
        if ! ip link show "$vh" >/dev/null 2>&1; then
            ip link add "$vh" type veth peer name eth0 netns "$n"
        fi
        ip link set "$vh" master "$BRIDGE"
        ip link set "$vh" up
        ip -n "$n" link set lo up
        ip -n "$n" addr replace "${NODE_IP[$n]}/24" dev eth0
        ip -n "$n" link set eth0 up
    done
}

net_down() {
    local n vh
    for n in $(all_nodes); do
        vh="$(veth_host "$n")"
        ! ip link show "$vh" >/dev/null 2>&1 || ip link del "$vh"
        [ ! -e "/var/run/netns/$n" ] || ip netns del "$n"
    done
    ! ip link show "$BRIDGE" >/dev/null 2>&1 || ip link del "$BRIDGE"
}

# /etc/hosts may be a bind mount (containers): rewrite it in place, never replace it.
hosts_strip() {
    awk -v b="$HOSTS_BEGIN" -v e="$HOSTS_END" '
        $0 == b {skip = 1; next}
        $0 == e {skip = 0; next}
        !skip' /etc/hosts
}
hosts_down() {
    grep -qxF "$HOSTS_BEGIN" /etc/hosts || return 0
    local tmp; tmp="$(hosts_strip)"
    printf '%s\n' "$tmp" >/etc/hosts
}
hosts_up() {
    local tmp n; tmp="$(hosts_strip)"
    {
        printf '%s\n' "$tmp"
        echo "$HOSTS_BEGIN"
        for n in "${NODES[@]}"; do echo "${NODE_IP[$n]} $n"; done
        echo "$HOSTS_END"
    } >"$DIR/hosts.new"
    cat "$DIR/hosts.new" >/etc/hosts
    rm -f "$DIR/hosts.new"
}

# ---------------------------------------------------------------------------- config
render_conf() {   # slurm.conf on stdout
    local mem_mb n gres=""
    mem_mb="$(awk '/^MemTotal:/ {print int($2 / 1024 * 0.9)}' /proc/meminfo)"
    {
        cat <<EOF
# Written by trebuchet tests/slurm_cluster/cluster.sh; rewritten by every cold 'up'.
# SlurmUser=root: jobs run as root here; the "shared filesystem" is this machine's.
ClusterName=$CLUSTER
SlurmctldHost=$(hostname)($BRIDGE_IP)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CryptoType=crypto/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SwitchType=switch/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
ReturnToService=2
MailProg=/bin/true
StateSaveLocation=$STATE
SlurmdSpoolDir=$SPOOL/slurmd-%n
SlurmctldPidFile=$RUN/slurmctld.pid
SlurmdPidFile=$RUN/slurmd-%n.pid
SlurmctldLogFile=$LOG/slurmctld.log
SlurmdLogFile=$LOG/slurmd-%n.log
# Per-node TmpFS: srun --mpi=pmix makes \$TmpFS/spmix_appdir_<uid>_<job>.<step> on each
# node; with one shared /tmp the second node fails with "File exists".
TmpFS=$DIR/tmp/%n
SlurmctldDebug=${TREB_SLURM_DEBUG:-info}
SlurmdDebug=${TREB_SLURM_DEBUG:-info}
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
KillWait=5
MinJobAge=300
Waittime=0
EOF
        if [ "$FAKE_GPUS" -gt 0 ]; then echo "GresTypes=gpu"; gres=" Gres=gpu:$FAKE_GPUS"; fi
        # CPUs: what each node declares (SlurmdParameters=config_overrides lets slurmd
        # accept more than the machine has), so that 8 ranks per node fit on 2 cores.
        for n in "${NODES[@]}"; do
            echo "NodeName=$n NodeAddr=${NODE_IP[$n]} NodeHostname=$n CPUs=$CPUS RealMemory=$mem_mb$gres State=UNKNOWN"
        done
        # OverSubscribe=FORCE:4: up to 4 jobs may share a core, so several tests (or a
        # 2-node x 2-task job next to another) fit on a 2-core machine. `debug` (the
        # default) is the 2-node cluster the tests were written for; `big` spans all nodes
        # (8 x 8 CPUs by default: a 64-rank job).
        echo "PartitionName=debug Nodes=tn1,tn2 Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4"
        echo "PartitionName=big Nodes=$(IFS=,; echo "${NODES[*]}") MaxTime=INFINITE State=UP OverSubscribe=FORCE:4"
    }
}

write_gres() {
    # Fake GPUs (TREB_SLURM_FAKE_GPUS=N): lets --gpus-per-node/--gres=gpu:N jobs be
    # scheduled on a machine without GPUs.
    local i
    if [ "$FAKE_GPUS" -gt 0 ]; then
        # Slurm drops a GPU without File=; plain empty files do (no device cgroup here).
        mkdir -p "$DIR/dev"
        for ((i = 0; i < FAKE_GPUS; i++)); do : >"$DIR/dev/fakegpu$i"; done
        echo "NodeName=$(IFS=,; echo "${NODES[*]}") Name=gpu File=$DIR/dev/fakegpu[0-$((FAKE_GPUS - 1))]" >"$DIR/etc/gres.conf"
    else
        rm -f "$DIR/etc/gres.conf"
    fi
}

# ---------------------------------------------------------------------------- health
daemons_alive() {
    pid_alive "$(pid_from "$RUN/slurmctld.pid")" slurmctld || return 1
    local n
    for n in $(started_nodes); do
        pid_alive "$(pid_from "$RUN/slurmd-$n.pid")" slurmd || return 1
    done
}

# Node states that count as up: idle, alloc, mix, comp, plnd (idle but planned by the
# backfill scheduler for a pending job, e.g. one asking more nodes than exist). A suffix ('*' = not
# responding, '~' = powered off, ...) or drain/down/inval does not count.
nodes_up() {    # nodes_up [idle]: all nodes up (or, with "idle", all idle)
    local want="${1:-}" out n st
    out="$(timeout 10 sinfo -h -N -o '%N %t' 2>/dev/null)" || return 1
    for n in $(started_nodes); do   # a node in two partitions is listed twice
        st="$(awk -v n="$n" '$1 == n {print $2; exit}' <<<"$out")"
        if [ "$want" = idle ]; then
            [ "$st" = idle ] || return 1
        else
            case "$st" in idle|alloc|mix|comp|plnd) ;; *) return 1 ;; esac
        fi
    done
}

healthy() {
    # daemons_alive first: munge's client retries for seconds when munged is gone.
    [ -f "$CONF" ] && daemons_alive && munge_ok && nodes_up
}

# ---------------------------------------------------------------------------- logs
cmd_logs() {
    local f
    for f in "$LOG"/*.log; do
        [ -f "$f" ] || continue
        echo "===== $f (last 60 lines)"
        tail -n 60 "$f"
    done
}

# ---------------------------------------------------------------------------- down
# Stop what `up` started; keeps $DIR (logs stay readable after a failed run).
teardown() {
    local n p pids="" nodes
    nodes="$(all_nodes)"
    for n in $nodes; do pids="$pids $(pid_from "$RUN/slurmd-$n.pid")"; done
    # slurmd and slurmctld stop in parallel (each takes 1-2 s).
    # shellcheck disable=SC2086
    stop_pids slurmd $pids &
    stop_pids slurmctld "$(pid_from "$RUN/slurmctld.pid")"
    wait
    # Job processes (slurmstepd and the tasks) live in the node namespaces; every
    # process in those namespaces was started by this cluster.
    # SIGTERM in every node, one second of grace for all, then SIGKILL.
    local left=""
    for n in $nodes; do
        [ -e "/var/run/netns/$n" ] || continue
        pids="$(ip netns pids "$n" 2>/dev/null || true)"
        [ -n "$pids" ] || continue
        log "ending leftover processes in $n: $(tr '\n' ' ' <<<"$pids")"
        for p in $pids; do kill -TERM "$p" 2>/dev/null || true; done
        left="$left $n"
    done
    if [ -n "$left" ]; then
        sleep 1
        for n in $left; do
            for p in $(ip netns pids "$n" 2>/dev/null || true); do kill -KILL "$p" 2>/dev/null || true; done
        done
    fi
    rm -f "$RUN"/slurmctld.pid "$RUN"/slurmd-*.pid
    net_down
    hosts_down
    rm -f "$NODES_UP"
}

cmd_down() {
    need_root
    mkdir -p "$DIR"
    exec 9>"$DIR/lock"; flock 9
    teardown
    munge_down
    log "down"
}

# ---------------------------------------------------------------------------- up
start_daemons() {
    local n
    # 9>&-: the daemons must not inherit the lock on $DIR/lock.
    slurmctld -f "$CONF" 9>&-
    for n in "${NODES[@]}"; do
        # nsenter, not `ip netns exec`: the latter remounts /sys and slurmd then fails
        # with "No filesystem mounted on /sys/fs/cgroup". unshare --uts gives the node
        # its own hostname, so that `hostname` in a job is the node name, which
        # resolves (via /etc/hosts) to the node's address, not to 127.0.x.
        # shellcheck disable=SC2016  # $1/$2 are expanded by that sh
        nsenter --net="/var/run/netns/$n" unshare --uts \
            sh -c 'hostname "$1"; exec slurmd -f "$2" -N "$1"' sh "$n" "$CONF" 9>&-
    done
}

cmd_up() {
    need_root
    local c
    for c in slurmctld slurmd sinfo munged munge unmunge ip nsenter unshare flock; do
        command -v "$c" >/dev/null || die "$c missing: run '$0 install' first"
    done
    mkdir -p "$DIR"
    exec 9>"$DIR/lock"; flock 9
    mkdir -p "$DIR/etc"
    render_conf >"$CONF.want"
    if healthy && cmp -s "$CONF.want" "$CONF"; then
        rm -f "$CONF.want"
        log "already up"
        return 0
    fi

    local t0=$SECONDS n other
    # Names (bridge, namespaces, node names) are fixed: one test cluster per machine.
    other="$(grep -F '# BEGIN trebuchet slurm test cluster (' /etc/hosts | grep -vxF "$HOSTS_BEGIN" || true)"
    if [ -n "$other" ]; then
        other="${other#*(}"
        die "another test cluster is up (TREB_SLURM_DIR=${other%)}): run its 'down' first"
    fi
    # Whatever is left of an earlier cluster goes first (keeps a working munged).
    teardown
    rm -rf "$STATE" "$SPOOL" "$LOG" "${DIR:?}/tmp" "${DIR:?}/dev"
    mkdir -p "$RUN" "$LOG" "$STATE" "$DIR/etc"
    printf '%s\n' "${NODES[@]}" >"$NODES_UP"
    for n in "${NODES[@]}"; do mkdir -p "$SPOOL/slurmd-$n" "$DIR/tmp/$n"; done
    chmod 755 "$DIR" "$RUN" "$LOG"

    munge_up
    net_up
    hosts_up
    mv "$CONF.want" "$CONF"
    write_gres
    start_daemons

    local deadline=$((SECONDS + TIMEOUT))
    until nodes_up idle; do
        if [ $SECONDS -ge $deadline ]; then
            log "nodes not idle after ${TIMEOUT}s"
            timeout 10 sinfo -N 2>&1 || true
            cmd_logs
            exit 1
        fi
        sleep 0.5
    done
    log "up in $((SECONDS - t0))s (SLURM_CONF=$CONF)"
}

cmd_status() {
    if [ -f "$CONF" ] && pid_alive "$(pid_from "$RUN/slurmctld.pid")" slurmctld; then
        timeout 10 sinfo 2>&1 || true
    else
        echo "slurmctld not running"
    fi
    if healthy; then echo "healthy"; return 0; fi
    echo "not healthy"
    return 1
}

cmd_env() { echo "export SLURM_CONF=$CONF"; }

case "${1:-}" in
    install) cmd_install ;;
    up) cmd_up ;;
    down) cmd_down ;;
    status) cmd_status ;;
    env) cmd_env ;;
    logs) cmd_logs ;;
    *) echo "usage: $0 {install|up|down|status|env|logs}" >&2; exit 2 ;;
esac
