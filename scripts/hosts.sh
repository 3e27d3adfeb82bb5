#!/usr/bin/env bash
# Separate hosts on one machine, for the cluster's multi-host tests (tests/cluster/test_hosts.py) and its bench
# (bench/cluster.py --part hosts): network namespaces joined by a bridge, each with its own interface, address and
# Ray node. That is what Ray's and Kubernetes' own multi-node tests do on one kernel.
#
#   scripts/hosts.sh up N        N hosts (N >= 2): h0 runs the Ray head, with the dashboard process that Ray Client
#                                (ray://h0:10001) needs; `vlora-va run --cluster auto` there runs the controller
#                                and the collector. h1.. are Ray worker nodes. Idempotent: whatever was up goes first.
#   scripts/hosts.sh down        every host's processes killed, namespaces, links and the bridge removed (always safe)
#   scripts/hosts.sh exec H CMD  CMD on host H (0..N-1) with the hosts' Ray environment
#   scripts/hosts.sh kill H      SIGKILL every process of host H (the raylet too): a machine that lost power
#   scripts/hosts.sh cut H       host H's link down (a partition)
#   scripts/hosts.sh heal H      host H's link up; a new Ray node there if Ray declared the old one dead meanwhile
#   scripts/hosts.sh address H   host H's address
#   scripts/hosts.sh cpus H LIST host H's processes, and whatever they start (a daemon), run on CPUs LIST only
#                                (taskset's list, e.g. 0 or 0-1): a machine of that many cores. It holds for the
#                                host's next Ray node too (after heal), until `down`
#
# The subnet (HOSTS_SUBNET, default 10.213.0) is private to this machine: the bridge carries no route out, the
# namespaces have no default route and forwarding is left as it is. Ray runs with token authentication
# (RAY_AUTH_MODE=token; the token at ~/.ray/auth_token is made if missing, mode 600). Each worker node offers the
# custom resource vlora_daemon (HOSTS_DAEMON_RESOURCE, default 1) and carries the node label
# vlora-va/group=h<i>, so a pipeline can place a stream's ingest (`group: h1`) or a daemon (`node_label: h2`).
#
# Needs: root (namespaces, links) and iproute2. Without root there are no network namespaces to make: run the
# cluster tests on one host (tests/cluster/test_cluster.py), or give the user CAP_NET_ADMIN and CAP_SYS_ADMIN.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PREFIX="${HOSTS_PREFIX:-vlora-h}"
BRIDGE="${HOSTS_BRIDGE:-vlora-br0}"
SUBNET="${HOSTS_SUBNET:-10.213.0}"
RAY_PORT="${HOSTS_RAY_PORT:-6390}"
RAY_TEMP="${HOSTS_RAY_TEMP:-/tmp/vlora-hosts-ray}"  # one per host (-h<i>): each node's log monitor reads its own
RAY_BIN="${HOSTS_RAY:-$ROOT/.venv/bin/ray}"
DAEMON_RESOURCE="${HOSTS_DAEMON_RESOURCE:-1}"
STATE="${HOSTS_STATE:-/tmp/vlora-hosts.count}"
LOG="${HOSTS_LOG:-/tmp/vlora-hosts.log}"  # what ray start said (read it when a host does not come up)
# A node that stops answering is declared dead after THRESHOLD health checks, one every PERIOD ms, each given
# TIMEOUT ms (Ray's defaults: 5 x 3000 with 10000 each: 30 s or more for a cut link; the failover goal is 10 s).
# The head reads them at start. A killed host is noticed sooner: its connections are reset at once.
export RAY_health_check_period_ms="${RAY_health_check_period_ms:-1000}"
export RAY_health_check_timeout_ms="${RAY_health_check_timeout_ms:-1000}"
export RAY_health_check_failure_threshold="${RAY_health_check_failure_threshold:-3}"
export RAY_AUTH_MODE=token

die() { echo "hosts.sh: $*" >&2; exit 1; }
need_root() {
    [ "$(id -u)" = 0 ] || die "network namespaces need root (or CAP_NET_ADMIN and CAP_SYS_ADMIN); none here"
    command -v ip >/dev/null || die "iproute2 (ip) is missing: apt-get install -y iproute2"
}
ns() { echo "$PREFIX$1"; }
address() { echo "$SUBNET.$((10 + $1))"; }
host_count() { [ -f "$STATE" ] && cat "$STATE" || echo 0; }

token() {
    local file="$HOME/.ray/auth_token"
    [ -s "$file" ] || "$RAY_BIN" get-auth-token --generate >/dev/null
    chmod 600 "$file"
}

make_host() {
    local i=$1 n
    n="$(ns "$i")"
    ip netns add "$n"
    ip link add "${PREFIX}v$i" type veth peer name eth0 netns "$n"
    ip link set "${PREFIX}v$i" master "$BRIDGE" up
    ip -n "$n" addr add "$(address "$i")/24" dev eth0
    ip -n "$n" link set eth0 up
    ip -n "$n" link set lo up
}

start_ray() {
    local i=$1 n
    n="$(ns "$i")"
    local pin=()
    [ -s "$STATE.cpus.$i" ] && pin=(taskset -c "$(cat "$STATE.cpus.$i")")
    if [ "$i" = 0 ]; then
        ip netns exec "$n" "${pin[@]}" "$RAY_BIN" start --head --port="$RAY_PORT" --node-ip-address="$(address 0)" \
            --num-cpus=1 --disable-usage-stats --temp-dir="$RAY_TEMP" >>"$LOG" 2>&1
    else
        ip netns exec "$n" "${pin[@]}" "$RAY_BIN" start --address="$(address 0):$RAY_PORT" --node-ip-address="$(address "$i")" \
            --num-cpus=1 --resources="{\"vlora_daemon\": $DAEMON_RESOURCE}" --labels="vlora-va/group=h$i" \
            --temp-dir="$RAY_TEMP-h$i" --disable-usage-stats >>"$LOG" 2>&1
    fi
}

up() {
    local count=$1 i
    [ "$count" -ge 2 ] || die "up needs at least 2 hosts (a head and a worker node)"
    need_root
    down
    trap 'down; exit 1' ERR
    echo "$count" >"$STATE"
    ip link add "$BRIDGE" type bridge
    ip link set "$BRIDGE" up  # no address here: the root namespace is not one of the hosts
    token
    for ((i = 0; i < count; i++)); do make_host "$i"; done
    for ((i = 0; i < count; i++)); do start_ray "$i"; done
    trap - ERR
    echo "hosts up: $count (head $(address 0):$RAY_PORT)"
}

down() {
    need_root
    local n link tries
    for n in $(ip netns list 2>/dev/null | awk '{print $1}' | grep "^$PREFIX[0-9]*$" || true); do
        ip netns pids "$n" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
        # a namespace lives on while a process in it does: wait for them to go (SIGKILL is not instant)
        for ((tries = 0; tries < 100; tries++)); do
            [ -z "$(ip netns pids "$n" 2>/dev/null)" ] && break
            sleep 0.1
        done
        ip netns del "$n" 2>/dev/null || true
    done
    for link in $(ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | cut -d@ -f1 | grep "^${PREFIX}v[0-9]*$" || true); do
        ip link del "$link" 2>/dev/null || true
    done
    ip link del "$BRIDGE" 2>/dev/null || true
    rm -f "$STATE" "$STATE".cpus.*
}

heal() {
    # The link back up. Ray never takes back a node it declared dead (its raylet exits when it hears so, which can
    # take half a minute of reconnecting): if the head says so, what is left of the host's Ray processes goes and a
    # new Ray node starts there (the daemon placed on this host then restarts on it).
    local i=$1
    need_root
    ip link set "${PREFIX}v$i" up
    if [ "$(node_alive "$i")" != True ]; then
        ip netns pids "$(ns "$i")" | xargs -r kill -9 2>/dev/null || true
        start_ray "$i"
        echo "host $i: its Ray node had been declared dead; a new one started"
    fi
}

node_alive() {
    # True when the head counts host $1's Ray node alive (asked from the head host, with Ray's own client)
    ip netns exec "$(ns 0)" env RAY_ADDRESS="$(address 0):$RAY_PORT" "$(dirname "$RAY_BIN")/python" -c "
import ray
ray.init(log_to_driver=False, logging_level='ERROR')
print(any(n['Alive'] and n['NodeManagerAddress'] == '$(address "$1")' for n in ray.nodes()))" 2>>"$LOG"
}

pin_cpus() {
    # every thread of every process on the host (a Ray worker started later inherits its raylet's CPUs)
    local i=$1 list=$2 pid
    need_root
    command -v taskset >/dev/null || die "taskset (util-linux) is missing"
    echo "$list" >"$STATE.cpus.$i"
    for pid in $(ip netns pids "$(ns "$i")"); do
        taskset -a -cp "$list" "$pid" >/dev/null 2>&1 || true  # (a process that just exited)
    done
}

kill_host() {
    need_root
    ip netns pids "$(ns "$1")" | xargs -r kill -9
}

case "${1:-}" in
    up) up "${2:?usage: hosts.sh up N}" ;;
    down) down ;;
    exec) i="${2:?usage: hosts.sh exec H CMD...}"; shift 2
          # a Ray driver started here connects to this host's node, not the head's (vlora_va/cluster/ray_connection.py)
          VLORA_VA_NODE_IP="$(address "$i")" exec ip netns exec "$(ns "$i")" "$@" ;;
    kill) kill_host "${2:?usage: hosts.sh kill H}" ;;
    cut) need_root; ip link set "${PREFIX}v${2:?usage: hosts.sh cut H}" down ;;
    heal) heal "${2:?usage: hosts.sh heal H}" ;;
    address) address "${2:?usage: hosts.sh address H}" ;;
    cpus) pin_cpus "${2:?usage: hosts.sh cpus H LIST}" "${3:?usage: hosts.sh cpus H LIST}" ;;
    count) host_count ;;
    *) die "usage: hosts.sh up N | down | exec H CMD... | kill H | cut H | heal H | address H | cpus H LIST | count" ;;
esac
