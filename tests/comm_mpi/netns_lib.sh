# Hosts made of network namespaces, for the mpi plugin's tests and bench:
# N namespaces, each with a veth pair whose other end is on a bridge in the
# root namespace, an address on one /24, and (optionally) a tbf rate limit
# on its egress, so that every host sends at most RATE. netem is used for
# a delay only where this kernel has it. Everything is named with a prefix
# unique to this process, and zd_netns_cleanup removes it all (call it from
# a trap). Source this file; it needs bash, iproute2 and root.
#
#   zd_netns_setup N [RATE [DELAY]]   RATE like "1gbit" ("" = no limit),
#                                     DELAY like "1ms" ("" = none)
#   after it: ZD_NS[i], ZD_IP[i], ZD_HOSTNAME[i] for i < N, ZD_SUBNET, and
#   ZD_RSH_AGENT: a wrapper for OMPI_MCA_plm_rsh_agent that runs a command
#   "on" a host (by address) in its namespace, as ssh would
#   zd_netns_run i CMD...             runs CMD in host i (its own hostname)
#   zd_netns_cleanup

ZD_PREFIX="zd$(( $$ % 100000 ))"
ZD_NS=()
ZD_IP=()
ZD_HOSTNAME=()
ZD_BRIDGE="${ZD_PREFIX}br"
ZD_DIR=""
ZD_DELAY_NOTE=""

zd_netns_cleanup() {
  local ns i
  # The root-side ends first: deleting one removes its pair at once, while
  # a namespace (and the veth in it) lives on until its last process exits.
  for (( i = 0; i < ${#ZD_NS[@]}; i++ )); do
    ip link del "${ZD_PREFIX}p$i" 2>/dev/null
  done
  for ns in "${ZD_NS[@]}"; do
    # Whatever still runs there (iperf3 servers, orted) goes with it.
    ip netns pids "$ns" 2>/dev/null | xargs -r kill -9 2>/dev/null
    ip netns del "$ns" 2>/dev/null
  done
  ip link del "$ZD_BRIDGE" 2>/dev/null
  [ -n "$ZD_DIR" ] && rm -rf "$ZD_DIR"
  return 0
}

# Exit status 77 (skipped) with the reason when namespaces cannot be made
# here; 1 for any other failure.
zd_netns_setup() {
  local n=$1 rate=${2:-} delay=${3:-}
  local net=$(( ($$ / 7) % 200 + 20 ))
  ZD_SUBNET="10.213.${net}.0/24"
  ZD_DIR=$(mktemp -d "/tmp/${ZD_PREFIX}.XXXX")
  local err
  if ! err=$(ip netns add "${ZD_PREFIX}h0" 2>&1); then
    echo "SKIPPED: cannot create a network namespace here ($err)." \
         "The netns test needs root (CAP_SYS_ADMIN and CAP_NET_ADMIN)." >&2
    exit 77
  fi
  ZD_NS+=("${ZD_PREFIX}h0")
  if ! err=$(ip link add "$ZD_BRIDGE" type bridge 2>&1); then
    echo "SKIPPED: cannot create a bridge ($err): needs CAP_NET_ADMIN" >&2
    exit 77
  fi
  ip link set "$ZD_BRIDGE" up || return 1
  local i ns veth peer
  for (( i = 0; i < n; i++ )); do
    ns="${ZD_PREFIX}h$i"
    [ "$i" -gt 0 ] && { ip netns add "$ns" || return 1; ZD_NS+=("$ns"); }
    veth="${ZD_PREFIX}v$i"
    peer="${ZD_PREFIX}p$i"
    ip link add "$veth" type veth peer name "$peer" || return 1
    ip link set "$peer" master "$ZD_BRIDGE" up || return 1
    ip link set "$veth" netns "$ns" || return 1
    ip -n "$ns" link set lo up || return 1
    ip -n "$ns" addr add "10.213.${net}.$((i + 1))/24" dev "$veth" || return 1
    ip -n "$ns" link set "$veth" up || return 1
    ZD_IP+=("10.213.${net}.$((i + 1))")
    ZD_HOSTNAME+=("${ZD_PREFIX}host$i")
    zd_netns_shape "$ns" "$veth" "$rate" "$delay" || return 1
  done
  # The rsh agent: "AGENT [ssh options] HOST COMMAND..." runs COMMAND, as
  # one shell line (ssh's way), in HOST's namespace with its hostname.
  ZD_RSH_AGENT="$ZD_DIR/rsh_agent"
  {
    echo '#!/bin/bash'
    echo 'while [ "${1:0:1}" = "-" ]; do shift; done'
    echo 'host=$1; shift'
    echo 'case "$host" in'
    for (( i = 0; i < n; i++ )); do
      echo "  ${ZD_IP[$i]}|${ZD_HOSTNAME[$i]}) ns=${ZD_NS[$i]}; name=${ZD_HOSTNAME[$i]} ;;"
    done
    echo '  *) echo "rsh_agent: unknown host $host" >&2; exit 255 ;;'
    echo 'esac'
    echo 'exec ip netns exec "$ns" unshare --uts /bin/sh -c "hostname $name; $*"'
  } >"$ZD_RSH_AGENT"
  chmod +x "$ZD_RSH_AGENT"
  return 0
}

# The rate limit (tbf) on a host's egress, under a netem delay when the
# kernel has netem.
zd_netns_shape() {
  local ns=$1 dev=$2 rate=$3 delay=$4
  local parent="root"
  if [ -n "$delay" ]; then
    if ip netns exec "$ns" tc qdisc add dev "$dev" root handle 1: netem delay "$delay" 2>/dev/null; then
      parent="parent 1:"
      ZD_DELAY_NOTE="delay $delay per direction (netem)"
    else
      ZD_DELAY_NOTE="delay NOT emulated: this kernel has no netem qdisc"
    fi
  fi
  [ -z "$rate" ] && return 0
  # burst: at least rate / HZ (1 ms of data at 1 kHz), here 2 ms worth.
  local burst
  burst=$(zd_rate_bits "$rate")
  burst=$(( burst / 8 / 500 ))
  [ "$burst" -lt 16384 ] && burst=16384
  ip netns exec "$ns" tc qdisc add dev "$dev" $parent handle 10: tbf rate "$rate" burst "$burst" latency 50ms
}

# "1gbit" -> 1000000000
zd_rate_bits() {
  local r=${1,,}
  case "$r" in
    *gbit) echo $(( ${r%gbit} * 1000000000 )) ;;
    *mbit) echo $(( ${r%mbit} * 1000000 )) ;;
    *kbit) echo $(( ${r%kbit} * 1000 )) ;;
    *bit) echo "${r%bit}" ;;
    *) echo "$r" ;;
  esac
}

zd_netns_run() {
  local i=$1
  shift
  ip netns exec "${ZD_NS[$i]}" unshare --uts /bin/sh -c 'hostname "$0"; exec "$@"' "${ZD_HOSTNAME[$i]}" "$@"
}
