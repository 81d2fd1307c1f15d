#!/usr/bin/env bash
# Multi-host training on one machine, for real (docs/multihost.md): hosts are
# network namespaces behind a bridge (hosts.sh), ranks talk over TCP only,
# each host has its own /dev/shm, hostname and working directory, and the
# checkpoints live on a folder every host sees (a shared file system).
#
#   test/multihost/multihost_test.sh TESSEL_BINARY [CASE...]
#
# Cases (all by default; each prints PASS/FAIL/SKIP and its wall time):
#   dp2          LLaMA tiny, dp=2 on 2 hosts x 1 rank, --bitwise: every step's
#                loss/grad-norm/param_hash bits equal the one-device run's
#                (tessel verify); it checkpoints at step 3
#   dp2tp2       resumes that checkpoint on dp=2,tp=2 over 2 hosts x 2 ranks:
#                steps 4..6 equal the one-device bits (the other host layout
#                loads the checkpoint and continues it)
#   link_down    dp=2 on 2 hosts; host 2's link goes down mid-run: every rank
#                exits within TESSEL_COMM_TIMEOUT (+ grace) with an error
#                naming the op, the communicator and the peer; the newest
#                complete checkpoint verifies
#   stall        dp=2,tp=2 on 2 x 2: one rank SIGSTOPped mid-run: the others
#                fail within the timeout naming it; the job ends
#   host_lost    dp=4 on 2 x 2: host 2 disappears (every process in it
#                SIGKILLed); the job ends; then elastic resume: dp=2 on host 1
#                alone continues from the newest complete checkpoint with the
#                uninterrupted one-device bits
#   bad_input    a hostfile naming an unreachable host, a mesh larger than the
#                hosts' slots, different builds on the two hosts: a clear
#                error before training starts
#
# Needs root, `ip netns` and mpirun; otherwise every case is skipped. Prints
# "[tessel-summary] passed=P failed=F skipped=S" (tools/run_tests.sh).
set -uo pipefail
export PATH="$PATH:/usr/sbin:/sbin"   # ip(8); Bazel's test PATH lacks sbin
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
TESSEL="$(readlink -f "$1")"; shift
ALL_CASES=(dp2 dp2tp2 link_down stall host_lost bad_input)
CASES=("$@"); [[ ${#CASES[@]} -eq 0 ]] && CASES=("${ALL_CASES[@]}")
# Next to this script when run from the tree; under test/multihost/ in
# Bazel's runfiles (the sh_test's executable is test/test_multihost).
if [[ -f "$HERE/hosts.sh" ]]; then source "$HERE/hosts.sh"
elif [[ -f "$HERE/multihost/hosts.sh" ]]; then source "$HERE/multihost/hosts.sh"
else echo "hosts.sh not found next to $0"; echo "[tessel-summary] passed=0 failed=1 skipped=0"; exit 1
fi

passed=0; failed=0; skipped=0
summary() { echo "[tessel-summary] passed=$passed failed=$failed skipped=$skipped"; }

if ! why=$(mh_requirements); then
  for c in "${CASES[@]}"; do echo "SKIP $c: $why"; done
  skipped=${#CASES[@]}; summary; exit 0
fi

# Seconds a collective may wait in the fault cases: short, so the test is.
FAULT_TIMEOUT=8
# Small and quick: LLaMA tiny, 6 steps of 8 sequences of 32 tokens.
STEPS=6
BASE=(train --model llama --config tiny --batch-size 8 --seq-len 32 --eval-every 0 --sample-length 0 --seed 7
      --log-every 1)
TRAIN=("${BASE[@]}" --steps $STEPS)

mh_setup 2 2 || { echo "FAIL setup: could not create the hosts"; failed=1; summary; exit 1; }
# A script that dies mid-way (a bug, a signal) must not read as a pass: the
# cases it never reported count as failed, then the hosts are removed.
finished=0
on_exit() {
  if (( !finished )); then
    echo "FAIL: the test script stopped before reporting every case"
    failed=$(( ${#CASES[@]} - passed - skipped ))
    summary
  fi
  mh_teardown
}
trap on_exit EXIT
SHARED="$MH_DIR/shared"   # what every host sees: the checkpoints and metrics
mkdir -p "$SHARED"

# Every rank runs through this wrapper: in its host's working directory, with
# its stderr kept in that host's folder (rankR.err), and its exit status and
# time in rankR.exit -- absent when the rank was killed.
cat >"$MH_DIR/rank" <<'EOF'
#!/usr/bin/env bash
r=${OMPI_COMM_WORLD_RANK:-x}
cd "$MH_HOST_DIR" || exit 1
"$@" 2>"$MH_HOST_DIR/rank$r.err"
rc=$?
echo "$rc $(date +%s.%N)" >"$MH_HOST_DIR/rank$r.exit"
exit $rc
EOF
chmod +x "$MH_DIR/rank"

# mpirun across the hosts, ranks placed round-robin by slot. Only the
# variables named with -x reach the ranks (as with ssh: the agent starts the
# daemons with an empty environment).
run_mpi() {
  mh_mpirun -x TESSEL_COMM_TIMEOUT -x TESSEL_THREADS "$@"
}
export TESSEL_THREADS=1   # 4 ranks on a 2-core machine: one thread each

clean_rank_files() { rm -f "$MH_DIR"/h*/rank*.err "$MH_DIR"/h*/rank*.exit; }
show_rank_files() {
  local f
  for f in "$MH_DIR"/h*/rank*.err; do [[ -s "$f" ]] && { echo "--- $f"; tail -n 5 "$f"; }; done
}

# The one-device reference (bitwise), once.
reference() {
  [[ -f "$SHARED/ref/metrics.jsonl" ]] && return 0
  (cd "$MH_DIR" && "$TESSEL" "${TRAIN[@]}" --bitwise --out-dir "$SHARED/ref" >"$SHARED/ref.log" 2>&1) ||
    { echo "one-device reference failed:"; tail -n 20 "$SHARED/ref.log"; return 1; }
}

# Waits until a complete checkpoint of step >= $2 exists under $1 (the run
# prunes old ones, so not necessarily step $2 itself); $3: the job's name.
wait_ckpt() {
  local root=$1 step=$2 until=$((SECONDS + 120)) d n
  for (( ; ; )); do
    for d in "$root"/step-*; do
      # step-N.tmp holds metadata.json just before its rename: not complete yet.
      [[ "$d" =~ /step-([0-9]+)$ && -f "$d/metadata.json" ]] || continue
      n=$((10#${BASH_REMATCH[1]}))
      (( n >= step )) && return 0
    done
    if (( SECONDS > until )) || ! kill -0 "$JOB" 2>/dev/null; then
      echo "no complete checkpoint of step >= $step under $root; the job's output:"
      tail -n 20 "$MH_DIR/$3.log"; show_rank_files
      return 1
    fi
    sleep 0.05
  done
}

# Every surviving rank's error names the op, the communicator and the peer.
# $1: the ranks that must report; $2: what the peer must look like.
check_rank_errors() {
  local ranks=$1 peer_re=$2 r f ok=0
  for r in $ranks; do
    f=$(ls "$MH_DIR"/h*/rank$r.err 2>/dev/null | head -n 1)
    if [[ -z "$f" ]] || ! grep -a -E "on '[^']+' \(mpi backend, rank [0-9]+ of [0-9]+\): timed out after [0-9.]+ s \(TESSEL_COMM_TIMEOUT\) waiting for $peer_re" "$f" >/dev/null; then
      echo "rank $r: no timeout error naming op, communicator and peer ($peer_re) in ${f:-its .err file}:"
      [[ -n "$f" ]] && tail -n 5 "$f"
      ok=1
    fi
  done
  return $ok
}

# The newest complete checkpoint verifies, and no step directory without
# metadata.json passes for complete.
check_ckpts() {
  local root=$1 d
  for d in "$root"/step-*; do
    [[ -d "$d" ]] || continue
    case "$d" in *.tmp|*.deleting) continue ;; esac
    [[ -f "$d/metadata.json" ]] || { echo "$d has no metadata.json but looks complete"; return 1; }
  done
  "$TESSEL" ckpt verify "$root" >"$MH_DIR/verify.log" 2>&1 || { echo "ckpt verify failed:"; tail "$MH_DIR/verify.log"; return 1; }
}

# ---- cases ------------------------------------------------------------------

case_dp2() {
  reference || return 1
  clean_rank_files
  # Through `tessel launch --hostfile`, as across real machines (the agent
  # stands in for ssh); 2 hosts x 1 rank: --map-by node puts rank 0 on host 1
  # and rank 1 on host 2.
  # Under a sanitizer its settings go to the ranks as mpirun -x (hosts.sh).
  mh_sanitizer_args
  local san=() a
  for a in "${MH_SAN_X[@]}"; do san+=("--mpi-arg=$a"); done
  TESSEL_COMM_TIMEOUT=60 timeout 300 "$TESSEL" launch -n 2 --hostfile "$MH_HOSTFILE" --agent "$MH_AGENT" \
    --tcp-if "$MH_SUBNET" --mpi-arg=--mca --mpi-arg=btl --mpi-arg=tcp,self --mpi-arg=--map-by --mpi-arg=node \
    "${san[@]}" -- "${TRAIN[@]}" --mesh dp=2 --bitwise --ckpt-every 3 --out-dir "$SHARED/dp2" >"$MH_DIR/dp2.log" 2>&1 ||
    { tail -n 30 "$MH_DIR/dp2.log"; return 1; }
  "$TESSEL" verify "$SHARED/ref/metrics.jsonl" "$SHARED/dp2/metrics.jsonl" || return 1
  check_ckpts "$SHARED/dp2/checkpoints"
}

case_dp2tp2() {
  reference || return 1
  [[ -f "$SHARED/dp2/checkpoints/step-00000003/metadata.json" ]] || { echo "needs case dp2's checkpoint"; return 1; }
  clean_rank_files
  rm -rf "$SHARED/dp2tp2"; mkdir -p "$SHARED/dp2tp2/checkpoints"
  cp -r "$SHARED/dp2/checkpoints/step-00000003" "$SHARED/dp2tp2/checkpoints/"
  head -n 3 "$SHARED/dp2/metrics.jsonl" >"$SHARED/dp2tp2/metrics.jsonl"
  # 2 hosts x 2 ranks: ranks 0,1 on host 1 (one tp group), 2,3 on host 2.
  TESSEL_COMM_TIMEOUT=60 run_mpi -np 4 --map-by slot "$MH_DIR/rank" "$TESSEL" "${TRAIN[@]}" --mesh dp=2,tp=2 \
    --bitwise --resume --ckpt-every 3 --out-dir "$SHARED/dp2tp2" >"$MH_DIR/dp2tp2.log" 2>&1 ||
    { tail -n 30 "$MH_DIR/dp2tp2.log"; show_rank_files; return 1; }
  [[ -f "$MH_DIR/h1/rank1.exit" && -f "$MH_DIR/h2/rank3.exit" ]] || { echo "ranks not 2 per host"; return 1; }
  grep -q -i "resum" "$MH_DIR/dp2tp2.log" || { echo "did not resume:"; head "$MH_DIR/dp2tp2.log"; return 1; }
  "$TESSEL" verify "$SHARED/ref/metrics.jsonl" "$SHARED/dp2tp2/metrics.jsonl" || return 1
  check_ckpts "$SHARED/dp2tp2/checkpoints"
}

# The fault cases train LONG_STEPS steps (long enough to still run when the
# fault comes, a few seconds), checkpointing every 2 steps.
LONG_STEPS=120
LONG=("${BASE[@]}" --steps $LONG_STEPS --bitwise --ckpt-every 2)
long_reference() {
  [[ -f "$SHARED/long_ref/metrics.jsonl" ]] && return 0
  (cd "$MH_DIR" && "$TESSEL" "${LONG[@]}" --out-dir "$SHARED/long_ref" >"$SHARED/long_ref.log" 2>&1) ||
    { echo "one-device reference failed:"; tail -n 20 "$SHARED/long_ref.log"; return 1; }
}
# start_long NAME MESH MPIRUN-ARGS...: the run in the background; JOB = mpirun's pid.
start_long() {
  local name=$1 mesh=$2; shift 2
  rm -rf "$SHARED/$name"
  clean_rank_files
  TESSEL_COMM_TIMEOUT=$FAULT_TIMEOUT MH_TIMEOUT=240 run_mpi "$@" "$MH_DIR/rank" "$TESSEL" "${LONG[@]}" \
    --mesh "$mesh" --out-dir "$SHARED/$name" >"$MH_DIR/$name.log" 2>&1 &
  JOB=$!
}
# Waits for mpirun to end, at most $1 seconds; JOB_RC = its exit status.
wait_job_within() {
  local limit=$1 start=$SECONDS
  while kill -0 "$JOB" 2>/dev/null; do
    if (( SECONDS - start > limit )); then
      echo "mpirun still runs ${limit} s later (a hang)"
      kill "$JOB" 2>/dev/null
      return 1
    fi
    sleep 0.2
  done
  wait "$JOB"
  JOB_RC=$?
}
# Every listed rank exited (its .exit file) at most $2 seconds after time $1.
check_exit_times() {
  local t0=$1 limit=$2 ranks=$3 r f ok=0
  for r in $ranks; do
    f=$(ls "$MH_DIR"/h*/rank$r.exit 2>/dev/null | head -n 1)
    if [[ -z "$f" ]]; then echo "rank $r never exited by itself"; ok=1; continue; fi
    local dt; dt=$(awk -v t0="$t0" '{printf "%.1f", $2 - t0}' "$f")
    echo "rank $r exited $dt s after the fault (status $(cut -d' ' -f1 "$f"))"
    awk -v d="$dt" -v l="$limit" 'BEGIN { exit !(d <= l) }' || { echo "rank $r: later than $limit s"; ok=1; }
  done
  return $ok
}
# The pid of world rank $2's tessel process on host $1.
rank_pid() {
  local p
  for p in $(ip netns pids "${MH_NS[$1]}"); do
    [[ "$(readlink /proc/$p/exe 2>/dev/null)" == "$TESSEL" ]] || continue
    tr '\0' '\n' </proc/$p/environ 2>/dev/null | grep -q "^OMPI_COMM_WORLD_RANK=$2$" && { echo "$p"; return 0; }
  done
  return 1
}
# Resumes run NAME on host 1 alone (2 slots) on MESH with NP ranks; its
# metrics must equal the uninterrupted one-device run's.
resume_on_host1() {
  local name=$1 mesh=$2 np=$3
  local newest; newest=$(ls -d "$SHARED/$name/checkpoints"/step-* 2>/dev/null | grep -v -E '\.(tmp|deleting)$' | tail -n 1)
  echo "resuming $(basename "$newest") of $name on host 1 alone: $mesh"
  echo "${MH_IP[1]} slots=2" >"$MH_DIR/hostfile.h1"
  # The failed job's daemon on host 1 may still be shutting down; a new one
  # starting beside it once failed to connect back to mpirun.
  local until=$((SECONDS + 15))
  while [[ -n "$(ip netns pids "${MH_NS[1]}")" ]] && (( SECONDS < until )); do sleep 0.2; done
  clean_rank_files
  MH_HOSTFILE="$MH_DIR/hostfile.h1" TESSEL_COMM_TIMEOUT=60 run_mpi -np "$np" "$MH_DIR/rank" "$TESSEL" "${LONG[@]}" \
    --mesh "$mesh" --resume --out-dir "$SHARED/$name" >"$MH_DIR/$name.resume.log" 2>&1 ||
    { tail -n 30 "$MH_DIR/$name.resume.log"; show_rank_files; return 1; }
  long_reference || return 1
  "$TESSEL" verify "$SHARED/long_ref/metrics.jsonl" "$SHARED/$name/metrics.jsonl"
}

case_link_down() {
  start_long link_down dp=2 -np 2 --map-by node
  wait_ckpt "$SHARED/link_down/checkpoints" 4 link_down || { kill "$JOB"; return 1; }
  local t0; t0=$(date +%s.%N)
  ip link set "${MH_VETH[2]}" down
  echo "host 2's link down at step >= 4"
  # Both sides lose each other: every rank must give up on its own, in time.
  local until=$((SECONDS + FAULT_TIMEOUT + 20)) ok=0
  while (( SECONDS < until )) && ! [[ -f "$MH_DIR/h1/rank0.exit" && -f "$MH_DIR/h2/rank1.exit" ]]; do sleep 0.2; done
  check_exit_times "$t0" $((FAULT_TIMEOUT + 10)) "0 1" || ok=1
  check_rank_errors 0 "rank 1 \((world rank 1, )?host h2\)" || ok=1
  check_rank_errors 1 "rank 0 \((world rank 0, )?host h1\)" || ok=1
  # mpirun cannot reach host 2's daemon while the link is down; once it is
  # back, the job ends at once (a link that never returns: docs/multihost.md).
  ip link set "${MH_VETH[2]}" up
  wait_job_within 30 || ok=1
  [[ ${JOB_RC:-0} -ne 0 ]] || { echo "mpirun exited 0 after a fault"; ok=1; }
  check_ckpts "$SHARED/link_down/checkpoints" || ok=1
  return $ok
}

# dp=2,tp=2 on 2 hosts x 2; world rank 3 (host 2) stopped: every survivor
# names the peers it waits for, and the job ends. Which peers a survivor names
# depends on where the stall caught it: in a tp or dp collective with rank 3 it
# names world rank 3; in a world-wide one (the grad-norm max) it may name the
# ranks it receives from, which themselves wait for rank 3. So the chain ends
# at rank 3: some survivor names it.
# Then elastic: the checkpoint resumes as tp=2 on host 1 alone, bitwise.
case_stall() {
  start_long stall dp=2,tp=2 -np 4 --map-by slot
  wait_ckpt "$SHARED/stall/checkpoints" 4 stall || { kill "$JOB"; return 1; }
  local pid; pid=$(rank_pid 2 3) || { echo "rank 3 not found on host 2"; kill "$JOB"; return 1; }
  local t0; t0=$(date +%s.%N)
  kill -STOP "$pid"
  echo "rank 3 (pid $pid, host 2) stopped at step >= 4"
  # The survivors time out together; the first to call MPI_Abort makes
  # mpirun end the others (their error is printed by then), so the bound is
  # on the job's end.
  local ok=0
  wait_job_within $((FAULT_TIMEOUT + 10)) || ok=1
  echo "job ended $(awk -v t0="$t0" -v t="$(date +%s.%N)" 'BEGIN { printf "%.1f", t - t0 }') s after the stall"
  check_rank_errors "0 1 2" "rank [0-9]+ \((world rank [0-9]+, )?host h[12]\)" || ok=1
  grep -a -h -E "waiting for .*(rank 3 \(host h2\)|world rank 3, host h2)" "$MH_DIR"/h*/rank[012].err >/dev/null ||
    { echo "no survivor named the stalled rank (world rank 3, host h2):"; tail -q -n 2 "$MH_DIR"/h*/rank[012].err; ok=1; }
  [[ ${JOB_RC:-0} -ne 0 ]] || { echo "mpirun exited 0 after a fault"; ok=1; }
  check_ckpts "$SHARED/stall/checkpoints" || ok=1
  (( ok == 0 )) || return 1
  resume_on_host1 stall tp=2 2
}

# dp=4 on 2 hosts x 2; host 2 disappears (its daemon and ranks SIGKILLed):
# mpirun sees its daemon go and ends the job, naming the host; then elastic:
# dp=2 on host 1 alone continues bitwise.
case_host_lost() {
  start_long host_lost dp=4 -np 4 --map-by slot
  wait_ckpt "$SHARED/host_lost/checkpoints" 4 host_lost || { kill "$JOB"; return 1; }
  local p
  for p in $(ip netns pids "${MH_NS[2]}"); do kill -9 "$p" 2>/dev/null; done
  echo "host 2 gone (every process in it killed) at step >= 4"
  local ok=0
  wait_job_within 20 || ok=1
  [[ ${JOB_RC:-0} -ne 0 ]] || { echo "mpirun exited 0 after a fault"; ok=1; }
  grep -a -q -E "${MH_IP[2]//./\\.}|h2" "$MH_DIR/host_lost.log" ||
    { echo "mpirun's report does not name host 2:"; tail -n 20 "$MH_DIR/host_lost.log"; ok=1; }
  check_ckpts "$SHARED/host_lost/checkpoints" || ok=1
  (( ok == 0 )) || return 1
  resume_on_host1 host_lost dp=2 2
}

case_bad_input() {
  local ok=0 out="$MH_DIR/bad.log"
  local LAUNCH=("$TESSEL" launch --hostfile "$MH_HOSTFILE" --agent "$MH_AGENT" --tcp-if "$MH_SUBNET")
  # A mesh larger than the hosts' slots (2 hosts x 2): refused before mpirun.
  if timeout 60 "${LAUNCH[@]}" -n 8 -- "${TRAIN[@]}" --mesh dp=8 --out-dir "$SHARED/bad1" >"$out" 2>&1 ||
     ! grep -q "launch: -n 8 ranks, but the hostfile '$MH_HOSTFILE' has 4 slots (${MH_IP[1]}: 2, ${MH_IP[2]}: 2)" "$out"; then
    echo "mesh larger than the slots: no clear error:"; tail -n 5 "$out"; ok=1
  fi
  # A mesh that does not match the world: the trainer's error, before any step.
  if timeout 60 "${LAUNCH[@]}" -n 2 --mpi-arg=--map-by --mpi-arg=node -- "${TRAIN[@]}" --mesh dp=4 \
       --out-dir "$SHARED/bad2" >"$out" 2>&1 || ! grep -q -E "dp=4|4 ranks|world" "$out" || [[ -f "$SHARED/bad2/metrics.jsonl" ]]; then
    echo "mesh of 4 on 2 ranks: no clear error:"; tail -n 5 "$out"; ok=1
  fi
  # A hostfile naming a host that does not answer (the agent fails as ssh does).
  printf '%s slots=1\n10.213.254.77 slots=1\n' "${MH_IP[1]}" >"$MH_DIR/hostfile.bad"
  if timeout 60 "$TESSEL" launch --hostfile "$MH_DIR/hostfile.bad" --agent "$MH_AGENT" --tcp-if "$MH_SUBNET" -n 2 \
       -- "${TRAIN[@]}" --mesh dp=2 --out-dir "$SHARED/bad3" >"$out" 2>&1 || ! grep -q "10.213.254.77" "$out" ||
     [[ -f "$SHARED/bad3/metrics.jsonl" ]]; then
    echo "unreachable host: no clear error:"; tail -n 10 "$out"; ok=1
  fi
  # Different builds: host 2 runs a copy of the binary with one more byte (a
  # different executable, as a stale copy on one machine would be).
  echo "unreachable host: $(grep -a -m1 -i -E 'error|unable|could not' "$out")"
  cp "$TESSEL" "$MH_DIR/tessel-other"; printf 'x' >>"$MH_DIR/tessel-other"
  if TESSEL_COMM_TIMEOUT=30 run_mpi -np 1 --host "${MH_IP[1]}" "$TESSEL" "${TRAIN[@]}" --mesh dp=2 --out-dir "$SHARED/bad4" \
       : -np 1 --host "${MH_IP[2]}" "$MH_DIR/tessel-other" "${TRAIN[@]}" --mesh dp=2 --out-dir "$SHARED/bad4" >"$out" 2>&1 ||
     ! grep -q "the ranks run different tessel builds" "$out" || ! grep -q "rank 1 (host h2)" "$out" ||
     [[ -f "$SHARED/bad4/metrics.jsonl" ]]; then
    echo "different builds: no clear error:"; tail -n 10 "$out"; ok=1
  fi
  echo "different builds: $(grep -a -m1 'different tessel builds' "$out")"
  return $ok
}

for c in "${CASES[@]}"; do
  start=$SECONDS
  echo "=== $c"
  if "case_$c"; then
    echo "PASS $c ($((SECONDS - start)) s)"; passed=$((passed + 1))
  else
    echo "FAIL $c ($((SECONDS - start)) s)"; failed=$((failed + 1))
  fi
  # Whatever a case left running (mpirun, by its pid) must not outlive it.
  [[ -n "${JOB:-}" ]] && kill "$JOB" 2>/dev/null
  JOB=""
done
# bash abandons a whole top-level command (this loop) on an expansion error
# and goes on with the next one: every case must have reported.
if (( passed + failed != ${#CASES[@]} )); then
  echo "FAIL: only $((passed + failed)) of ${#CASES[@]} cases reported"
  failed=$(( ${#CASES[@]} - passed ))
fi
finished=1
summary
[[ $failed -eq 0 ]]
