#!/usr/bin/env bash
# Real SSH hosts on this one machine, for the `--on ssh` tests and CI: two, or
# TREB_SSH_HOST_COUNT of them (2..9; the node-loss tests use 3: two nodes and a spare).
#
#   hosts.sh up       start them (idempotent: returns at once when both answer)
#   hosts.sh down     stop the sshd daemons by pid, end what runs in the namespaces, and
#                     remove the namespaces, the bridge and the key (idempotent)
#   hosts.sh status   exit 0 when `ssh -F CONFIG tsN hostname` answers tsN on both hosts
#   hosts.sh env      print the `export TREB_SSH_CONFIG=... TREB_SSH_HOSTS=...` line
#
# Layout: a bridge (trebssh0, 10.78.0.1/24) in the root network namespace; each host ts1,
# ts2 is a network namespace of that name with its own address (10.78.0.11, .12) on a veth
# pair, and its own UTS namespace (`hostname` prints ts1). In each one a real sshd (Debian's
# openssh-server) listens on the host's address with a throwaway host key; the client key
# is a throwaway ed25519 key, and CONFIG is an ssh config file (`ssh -F CONFIG`) with one
# Host block per host, so the user's own ~/.ssh is never read or changed. The filesystem
# and the PID space are this machine's: a test sees every process on the hosts with `ps`.
# Nothing here is shared with the Slurm test cluster (other bridge, names and addresses).
#
# Needs root, openssh-server and rsync (scripts/system-deps installs them).
# Environment: TREB_SSH_HOSTS_DIR (default /var/tmp/treb-ssh-hosts): keys, configs, pids.
set -euo pipefail

DIR="${TREB_SSH_HOSTS_DIR:-/var/tmp/treb-ssh-hosts}"
NET=10.78.0
BRIDGE=trebssh0
COUNT="${TREB_SSH_HOST_COUNT:-2}"
case "$COUNT" in [1-9]) ;; *) echo "TREB_SSH_HOST_COUNT must be 1..9, not $COUNT" >&2; exit 2 ;; esac
HOSTS=()
declare -A HOST_IP=()
for _i in $(seq 9); do  # `down` and `status` see every host that may be up
    HOST_IP[ts$_i]="$NET.1$_i"
    [ "$_i" -gt "$COUNT" ] || HOSTS+=("ts$_i")
done
CONFIG="$DIR/ssh_config"
KEY="$DIR/id_ed25519"

log() { echo "[treb-ssh-hosts] $*" >&2; }
die() { log "ERROR: $*"; exit 1; }
need_root() { [ "$(id -u)" = 0 ] || die "must run as root"; }
case "$DIR" in /?*) ;; *) die "TREB_SSH_HOSTS_DIR must be an absolute path" ;; esac

pid_of() { if [ -s "$DIR/sshd-$1.pid" ]; then cat "$DIR/sshd-$1.pid"; fi; }

answers() {  # the host's sshd answers with its own hostname
    [ -f "$CONFIG" ] || return 1
    [ "$(timeout 10 ssh -F "$CONFIG" -o BatchMode=yes "$1" hostname 2>/dev/null)" = "$1" ]
}

cmd_status() {
    local h ok=0
    for h in "${HOSTS[@]}"; do
        if answers "$h"; then echo "$h up (${HOST_IP[$h]})"; else echo "$h down"; ok=1; fi
    done
    return $ok
}

write_files() {
    mkdir -p "$DIR" /run/sshd
    chmod 700 "$DIR"
    [ -f "$KEY" ] || ssh-keygen -q -t ed25519 -N '' -C treb-ssh-test -f "$KEY"
    cp "$KEY.pub" "$DIR/authorized_keys"
    : >"$CONFIG"
    local h
    for h in "${HOSTS[@]}"; do
        [ -f "$DIR/hostkey-$h" ] || ssh-keygen -q -t ed25519 -N '' -f "$DIR/hostkey-$h"
        cat >"$DIR/sshd-$h.conf" <<EOF
ListenAddress ${HOST_IP[$h]}
HostKey $DIR/hostkey-$h
PidFile $DIR/sshd-$h.pid
AuthorizedKeysFile $DIR/authorized_keys
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
MaxSessions 64
MaxStartups 64:30:128
EOF
        cat >>"$CONFIG" <<EOF
Host $h
    HostName ${HOST_IP[$h]}
    User root
    IdentityFile $KEY
    IdentitiesOnly yes
    StrictHostKeyChecking no
    UserKnownHostsFile /dev/null
    LogLevel ERROR
EOF
    done
}

net_up() {
    local h vh
    ip link show "$BRIDGE" >/dev/null 2>&1 || ip link add "$BRIDGE" type bridge
    ip addr replace "$NET.1/24" dev "$BRIDGE"
    ip link set "$BRIDGE" up
    for h in "${HOSTS[@]}"; do
        vh="tssh-$h"
        [ -e "/var/run/netns/$h" ] || ip netns add "$h"
        ip link show "$vh" >/dev/null 2>&1 || ip link add "$vh" type veth peer name eth0 netns "$h"
        ip link set "$vh" master "$BRIDGE"
        ip link set "$vh" up
        ip -n "$h" link set lo up
        ip -n "$h" addr replace "${HOST_IP[$h]}/24" dev eth0
        ip -n "$h" link set eth0 up
    done
}

forget_host_keys() {  # what an ssh without -F (horovodrun's) recorded of the throwaway keys
    local h
    [ -f "$HOME/.ssh/known_hosts" ] || return 0
    for h in "${HOSTS[@]}"; do
        ssh-keygen -q -R "${HOST_IP[$h]}" -f "$HOME/.ssh/known_hosts" >/dev/null 2>&1 || true
    done
    rm -f "$HOME/.ssh/known_hosts.old"
}

cmd_down() {
    need_root
    local h p pids left="" i
    for i in $(seq $((COUNT + 1)) 9); do  # hosts a larger count brought up
        [ ! -e "/var/run/netns/ts$i" ] || HOSTS+=("ts$i")
    done
    for h in "${HOSTS[@]}"; do
        p="$(pid_of "$h")"
        [ -z "$p" ] || kill -TERM "$p" 2>/dev/null || true
        rm -f "$DIR/sshd-$h.pid"
        # What still runs in a host's namespace (sessions, a test's leftovers) was started
        # through its sshd: TERM, a second of grace, KILL.
        [ -e "/var/run/netns/$h" ] || continue
        pids="$(ip netns pids "$h" 2>/dev/null || true)"
        [ -n "$pids" ] || continue
        for p in $pids; do kill -TERM "$p" 2>/dev/null || true; done
        left="$left $h"
    done
    if [ -n "$left" ]; then
        sleep 1
        for h in $left; do
            for p in $(ip netns pids "$h" 2>/dev/null || true); do kill -KILL "$p" 2>/dev/null || true; done
        done
    fi
    for h in "${HOSTS[@]}"; do
        ! ip link show "tssh-$h" >/dev/null 2>&1 || ip link del "tssh-$h"
        [ ! -e "/var/run/netns/$h" ] || ip netns del "$h"
    done
    ! ip link show "$BRIDGE" >/dev/null 2>&1 || ip link del "$BRIDGE"
    forget_host_keys
    rm -rf "${DIR:?}"
    log "down"
}

cmd_up() {
    need_root
    local c h ok
    for c in ip nsenter unshare ssh ssh-keygen; do
        command -v "$c" >/dev/null || die "$c missing"
    done
    [ -x /usr/sbin/sshd ] || die "/usr/sbin/sshd missing: apt-get install openssh-server (scripts/system-deps)"
    if cmd_status >/dev/null 2>&1; then log "already up"; return 0; fi
    write_files
    forget_host_keys
    net_up
    for h in "${HOSTS[@]}"; do
        answers "$h" && continue
        p="$(pid_of "$h")"
        [ -z "$p" ] || kill -TERM "$p" 2>/dev/null || true
        # nsenter, not `ip netns exec` (which remounts /sys); unshare --uts: its own hostname.
        # unshare --mount: a host whose ~/.bashrc is empty, as on a plain server. This
        # machine's root runs `pyenv rehash` from it at every ssh login (bash sources it for
        # ssh commands), and a login killed mid-rehash (the connection-drop test) leaves a
        # lock that stalls every later login for 60 s.
        : >"$DIR/empty-bashrc"
        # Each host resolves the hosts' names, as a server resolves its own (horovod's gloo
        # needs that: hvd.init() crashes on a host whose own name does not resolve): this
        # machine's /etc/hosts plus theirs, bound over /etc/hosts in the host's namespace.
        { cat /etc/hosts; for n in "${HOSTS[@]}"; do echo "${HOST_IP[$n]} $n"; done; } >"$DIR/hosts"
        # shellcheck disable=SC2016  # $1.. are expanded by that sh
        nsenter --net="/var/run/netns/$h" unshare --uts --mount --propagation private \
            sh -c 'hostname "$1"; if [ -f "$HOME/.bashrc" ]; then mount --bind "$4" "$HOME/.bashrc"; fi
                   mount --bind "$5" /etc/hosts
                   exec /usr/sbin/sshd -f "$2" -E "$3"' sh "$h" \
            "$DIR/sshd-$h.conf" "$DIR/sshd-$h.log" "$DIR/empty-bashrc" "$DIR/hosts"
    done
    for h in "${HOSTS[@]}"; do
        ok=1
        for _ in $(seq 50); do answers "$h" && { ok=0; break; }; sleep 0.1; done
        [ $ok = 0 ] || die "$h does not answer (see $DIR/sshd-$h.log)"
    done
    log "up: ${HOSTS[*]} (ssh -F $CONFIG)"
}

case "${1:-}" in
    up) cmd_up ;;
    down) cmd_down ;;
    status) cmd_status ;;
    env) echo "export TREB_SSH_CONFIG=$CONFIG TREB_SSH_HOSTS='${HOSTS[*]}'" ;;
    *) echo "usage: $0 up|down|status|env" >&2; exit 2 ;;
esac
