#!/usr/bin/env bash
# Runs a Catch2 test binary under mpirun and prints one "[tessel-summary]" line
# for tools/run_tests.sh. Usage: mpi_test.sh BINARY NP [catch2 args...]
#
# Every rank prints "[tessel-summary-rank R] passed=P failed=F skipped=S"
# (test/main.cc). A test case counts as failed if it failed on any rank, so the
# summary takes rank 0's totals with failed = the largest per-rank failed
# count; a rank without a summary line (crash) or a non-zero mpirun exit adds
# one failure.
set -uo pipefail
bin="$1"; np="$2"; shift 2

# mpirun inside a container: root is fine, ranks may outnumber cores, shared
# memory between processes on this machine only (no network but loopback).
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl=self,vader
export OMPI_MCA_btl_vader_single_copy_mechanism=none
export OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_hwloc_base_binding_policy=none
# A short session directory: PMIx's socket paths must fit in 108 bytes, and
# Bazel's TEST_TMPDIR is long.
session=$(mktemp -d /tmp/tessel-mpi.XXXXXX)
trap 'rm -rf "$session"' EXIT
export TMPDIR="$session" OMPI_MCA_orte_tmpdir_base="$session"
# Shared-memory backing files in the job's own folder too, not /dev/shm:
# Bazel runs tests in PID namespaces, so two concurrent mpiruns can have the
# same PID, hence the same job id and the same /dev/shm file names -- each
# then maps (and finally deletes) the other's segments: segfaults, and
# "shared memory initialization ... open(2) ... No such file" (the
# test_pipeline_mpi / test_parallel_train_mpi crashes of full-suite runs).
export OMPI_MCA_btl_vader_backing_directory="$session" OMPI_MCA_shmem_mmap_backing_file_base_dir="$session"
export OMPI_MCA_osc_sm_backing_directory="$session"

# Under ./tessel test --asan: the slow unwinder, which LeakSanitizer's
# suppressions of OpenMPI's own leaks need (tools/run_tests.sh).
[[ -n "${ASAN_OPTIONS:-}" ]] && export ASAN_OPTIONS="$ASAN_OPTIONS:fast_unwind_on_malloc=0"

log="$session/out.log"
# TESSEL_MPI_TEST_TIMEOUT: longer under the sanitizers (tools/run_tests.sh).
timeout "${TESSEL_MPI_TEST_TIMEOUT:-600}" mpirun -np "$np" "$bin" "$@" >"$log" 2>&1
rc=$?
cat "$log"

# mpirun gives the ranks a pty, so Catch2 colours its output: colour codes
# (which can land before a summary line) are stripped first.
p0=""; maxf=0; s0=0; ranks=0
while read -r line; do
  r=$(sed -E 's/^\[tessel-summary-rank ([0-9]+)\].*/\1/' <<<"$line")
  p=$(sed -E 's/.*passed=([0-9]+).*/\1/' <<<"$line")
  f=$(sed -E 's/.*failed=([0-9]+).*/\1/' <<<"$line")
  s=$(sed -E 's/.*skipped=([0-9]+).*/\1/' <<<"$line")
  ranks=$((ranks + 1))
  (( f > maxf )) && maxf=$f
  if [[ "$r" == "0" ]]; then p0=$((p + f)); s0=$s; f0=$f; fi
done < <(sed -E 's/\x1b\[[0-9;]*m//g' "$log" | grep -a '^\[tessel-summary-rank ')

if [[ -z "$p0" ]]; then
  echo "mpi_test.sh: rank 0 printed no summary (mpirun exit $rc)"
  echo "[tessel-summary] passed=0 failed=1 skipped=0"
  exit 1
fi
failed=$maxf
if [[ $ranks -ne $np || $rc -ne 0 ]] && [[ $failed -eq 0 ]]; then
  echo "mpi_test.sh: $ranks of $np ranks printed a summary, mpirun exit $rc"
  failed=1
fi
passed=$((p0 - failed)); (( passed < 0 )) && passed=0
echo "[tessel-summary] passed=$passed failed=$failed skipped=$s0"
[[ $failed -eq 0 ]]
