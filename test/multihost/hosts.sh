# Sourced by the multi-host tests: simulated hosts on one machine.
#
# A "host" is a Linux network namespace joined by a veth pair to a bridge in
# the root namespace, so mpirun (its HNP stays in the root namespace, like a
# login node) reaches every host's orted over TCP, and the hosts reach each
# other only through the bridge. Commands run on a host through the launcher
# agent (mh_agent, installed as $MH_DIR/agent and passed to mpirun as
# plm_rsh_agent: it is called as `agent HOST COMMAND...`, the shape of
# `ssh HOST COMMAND...`). Each command gets a private mount and UTS
# namespace with its own tmpfs on /dev/shm and the host's hostname, so no
# shared-memory segment can cross hosts, and its own working directory; like
# sshd, the agent starts it with a fresh environment.
#
#   mh_requirements || skip            # root, ip netns, unshare, mpirun
#   mh_setup 2 2                       # 2 hosts, 2 slots each; sets MH_* (below)
#   mh_mpirun -np 4 BINARY ARGS...     # mpirun across the hosts, TCP only
#   mh_teardown                        # also on EXIT (mh_setup sets the trap)
#
# Names carry a per-run id (MH_ID) so concurrent runs never collide:
# namespaces tsl-ID-hN, bridge tbID, veths tvIDaN (root side) / eth0 (host
# side), subnet 10.213.X.0/24 with X chosen from the free ones.

mh_requirements() {
  [[ $(id -u) -eq 0 ]] || { echo "not root"; return 1; }
  command -v ip >/dev/null || { echo "no iproute2 (ip)"; return 1; }
  command -v unshare >/dev/null || { echo "no unshare (util-linux)"; return 1; }
  command -v mpirun >/dev/null || { echo "no mpirun (openmpi-bin)"; return 1; }
  local probe="tsl-probe-$$-$RANDOM"
  ip netns add "$probe" 2>/dev/null || { echo "ip netns add failed (no CAP_SYS_ADMIN / network namespaces)"; return 1; }
  ip netns del "$probe"
  return 0
}

# mh_setup HOSTS SLOTS: creates the hosts, the hostfile $MH_HOSTFILE (one
# line per host: its address, slots=SLOTS) and the agent $MH_AGENT.
# Sets MH_ID, MH_DIR, MH_SUBNET, MH_NS[i], MH_IP[i], MH_VETH[i] (i = 1..HOSTS).
mh_setup() {
  local hosts=$1 slots=$2
  MH_ID=$(printf '%04x%02x' $(( $$ & 0xffff )) $(( RANDOM & 0xff )))
  MH_DIR=$(mktemp -d "/tmp/tsl-mh-$MH_ID.XXXX")
  MH_BRIDGE="tb$MH_ID"
  trap mh_teardown EXIT
  # A /24 no interface of this machine uses (concurrent runs pick different ones).
  local x used
  used=$(ip -4 -o addr show | awk '{print $4}')
  for _ in $(seq 1 50); do
    x=$(( (RANDOM % 250) + 1 ))
    grep -q "^10\.213\.$x\." <<<"$used" || break
  done
  MH_SUBNET="10.213.$x.0/24"
  ip link add "$MH_BRIDGE" type bridge || return 1
  ip addr add "10.213.$x.254/24" dev "$MH_BRIDGE"
  ip link set "$MH_BRIDGE" up
  : >"$MH_DIR/hostfile"
  : >"$MH_DIR/hosts.map"
  MH_NS=(); MH_IP=(); MH_VETH=()
  local i
  for i in $(seq 1 "$hosts"); do
    MH_NS[$i]="tsl-$MH_ID-h$i"
    MH_IP[$i]="10.213.$x.$i"
    MH_VETH[$i]="tv${MH_ID}a$i"
    ip netns add "${MH_NS[$i]}" || return 1
    ip link add "${MH_VETH[$i]}" type veth peer name "tv${MH_ID}b$i" || return 1
    ip link set "tv${MH_ID}b$i" netns "${MH_NS[$i]}"
    ip -n "${MH_NS[$i]}" link set "tv${MH_ID}b$i" name eth0
    ip -n "${MH_NS[$i]}" addr add "${MH_IP[$i]}/24" dev eth0
    ip -n "${MH_NS[$i]}" link set eth0 up
    ip -n "${MH_NS[$i]}" link set lo up
    ip link set "${MH_VETH[$i]}" master "$MH_BRIDGE"
    ip link set "${MH_VETH[$i]}" up
    mkdir -p "$MH_DIR/h$i/tmp"
    echo "${MH_IP[$i]} slots=$slots" >>"$MH_DIR/hostfile"
    echo "${MH_IP[$i]} ${MH_NS[$i]} h$i $MH_DIR/h$i" >>"$MH_DIR/hosts.map"
  done
  MH_HOSTFILE="$MH_DIR/hostfile"
  MH_AGENT="$MH_DIR/agent"
  # The launcher agent: `agent HOST COMMAND...`, like ssh. The command is one
  # shell string once joined (mpirun quotes its orted arguments for a remote
  # shell), so it runs through sh -c, as sshd would run it.
  cat >"$MH_AGENT" <<AGENT
#!/usr/bin/env bash
set -u
host="\$1"; shift
line=\$(awk -v h="\$host" '\$1 == h || \$3 == h' "$MH_DIR/hosts.map")
if [[ -z "\$line" ]]; then
  echo "agent: ssh: Could not resolve hostname \$host: not a host of this test run" >&2
  exit 255
fi
read -r ip ns name dir <<<"\$line"
# As sshd would: a fresh environment (only what mpirun passes with -x or on
# the orted command line reaches the ranks), plus the host's own folders.
# This process stays on the launching host, as an ssh client does: when the
# remote side is killed (a host that disappears), ssh does not exit at once
# but hangs on its dead connection, and mpirun learns of the loss from its
# daemon's connection -- naming the host. Exiting here at once instead
# raced that report with mpirun's "daemon failed" one, which names no host.
env -i PATH="\$PATH" HOME="\${HOME:-/}" TMPDIR="\$dir/tmp" MH_HOST_DIR="\$dir" MH_HOST="\$name" \
  ip netns exec "\$ns" unshare --mount --uts --propagation private \\
  sh -c 'mount -t tmpfs -o size=512m tmpfs /dev/shm && hostname "\$0" && cd "\$1" && exec sh -c "\$2"' \\
  "\$name" "\$dir" "\$*"
rc=\$?
if (( rc == 137 )); then exec sleep 600; fi  # SIGKILLed remote: a hung ssh client (mpirun ends it)
exit \$rc
AGENT
  chmod +x "$MH_AGENT"
}

# mpirun across the hosts over TCP only: no shared memory (vader), no UCX
# (it would pick shared memory or a verbs device), daemons launched through
# the agent, every socket on the bridge's subnet. MH_TIMEOUT (seconds,
# default 300) bounds the whole job, so a hang fails the test instead of CI.
# The hosts start from an empty environment: a sanitizer run's settings
# reach the ranks through mpirun -x (the slow unwinder for LeakSanitizer's
# suppressions of OpenMPI's leaks, as test/mpi_test.sh). Sets MH_SAN_X to
# those -x arguments (empty outside a sanitizer run).
mh_sanitizer_args() {
  MH_SAN_X=()
  local v
  for v in ASAN_OPTIONS LSAN_OPTIONS UBSAN_OPTIONS TSAN_OPTIONS TESSEL_CPU_ALLOCATOR \
    OMPI_MCA_mca_base_component_disable_dlclose; do
    [[ -n "${!v:-}" ]] || continue
    [[ $v == ASAN_OPTIONS && $ASAN_OPTIONS != *fast_unwind_on_malloc=0* ]] &&
      export ASAN_OPTIONS="$ASAN_OPTIONS:fast_unwind_on_malloc=0"
    MH_SAN_X+=(-x "$v")
  done
}

mh_mpirun() {
  mh_sanitizer_args
  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 TMPDIR="$MH_DIR" \
    timeout -k 5 "${MH_TIMEOUT:-300}" mpirun "${MH_SAN_X[@]}" --hostfile "$MH_HOSTFILE" \
    --mca plm rsh --mca plm_rsh_agent "$MH_AGENT" \
    --mca pml ob1 --mca btl tcp,self \
    --mca btl_tcp_if_include "$MH_SUBNET" --mca oob_tcp_if_include "$MH_SUBNET" \
    --mca hwloc_base_binding_policy none \
    "$@"
}

# Runs a command on host i (outside MPI): mh_on i COMMAND...
mh_on() {
  local i=$1; shift
  "$MH_AGENT" "${MH_IP[$i]}" "$@"
}

mh_teardown() {
  [[ -n "${MH_DIR:-}" ]] || return 0
  local i pid
  for i in "${!MH_NS[@]}"; do
    # Processes this run started inside the namespace (by id, never by name).
    for pid in $(ip netns pids "${MH_NS[$i]}" 2>/dev/null); do kill -9 "$pid" 2>/dev/null; done
    ip netns del "${MH_NS[$i]}" 2>/dev/null
  done
  ip link del "$MH_BRIDGE" 2>/dev/null
  if [[ -n "${MH_KEEP:-}" ]]; then echo "kept $MH_DIR (MH_KEEP)"; else rm -rf "$MH_DIR"; fi
  MH_DIR=""
}
