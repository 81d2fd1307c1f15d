#!/usr/bin/env bash
# Runs every test target and prints one summary line:
#   N passed, M failed, K skipped
# N/M/K count test cases (Catch2 TEST_CASEs, via the "[tessel-summary]" line each
# binary prints). A target that fails to build, crashes, or prints no summary
# counts as one failed test. Extra arguments go to `bazel test`. Last, the
# workspace examples/external (tessel as a library) is built and run: one
# more test case.
#
# --asan / --tsan (first argument): the same under a sanitizer (docs/build.md
# "Sanitizers"): the .bazelrc config of that name, in a Bazel output base of
# its own and without the shared disk cache (sanitizer builds are large and
# would crowd the normal build out of it), the pooling CPU allocator off.
# --asan runs every test target; --tsan the ones that run threads in one
# process (every cc_test: the MPI tests run their ranks as processes, and
# OpenMPI's shared-memory transport is not instrumented). examples/external
# is not part of either (it builds tessel as a plain external repository).
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
source tools/bazel_flags.sh

sanitizer=""
case "${1:-}" in
  --asan | --tsan) sanitizer="${1#--}"; shift ;;
esac
STARTUP=()
universe='//...'
if [[ -n "$sanitizer" ]]; then
  # Not //...: the normal build's convenience symlinks (bazel-<dir>, bazel-out,
  # ...) point into another output base, and a server of its own would walk
  # into them. Every top-level folder but those, and the root package.
  # Folders without a package (a training run's runs/, gpu_bundle/) would
  # fail the whole query ("no targets found beneath 'runs'").
  universe='//:all'
  for d in */; do
    d="${d%/}"
    [[ "$d" == bazel-* || -L "$d" ]] && continue
    [[ -n "$(find "$d" \( -name BUILD -o -name BUILD.bazel \) -print -quit)" ]] && universe+=" + //$d/..."
  done
fi
query="tests($universe) except attr(tags, \"manual\", $universe)"
if [[ -n "$sanitizer" && -x "${CUDA_PATH:-/usr/local/cuda}/bin/nvcc" && "${TESSEL_NO_CUDA:-}" != 1 ]]; then
  # Where CUDA is built (third_party/cuda), the tests that call it are left
  # out: the sanitizer builds link shared libraries, and cudart is a static
  # archive whose symbols the CUDA kernels' shared library does not see (the
  # first CUDA call ends the binary: "symbol lookup error"). Without a GPU
  # they would only skip; the GPU side has compute-sanitizer (docs/cuda.md).
  query="$query except filter('_cuda\$', $universe) except //test:test_ops except //test:test_comm_nccl"
fi
if [[ -n "$sanitizer" ]]; then
  # One output base per checkout and sanitizer (a Bazel server each); no
  # convenience symlinks, so bazel-bin keeps pointing at the normal build.
  san_root="${TESSEL_SAN_OUTPUT_ROOT:-$HOME/.cache/tessel/sanitizers}"
  mkdir -p "$san_root"
  STARTUP=("--output_base=$san_root/$(printf %s "$ROOT" | md5sum | cut -c1-12)-$sanitizer")
  # --disk_cache= (empty) turns off the cache bazel_flags.sh named.
  # Sanitized debug builds run 10-30x slower: the heavy training tests
  # (test_bitwise_train, test_parallel_train, ...) overran Bazel's default
  # timeouts. Ten times the defaults (60/300/900/3600 s) under --asan;
  # thirty under --tsan, whose rank threads are all instrumented:
  # test_parallel_train took ~35 min (73 s normally) and test_bitwise_train
  # ran past 3000 s (88 s normally) with two TSan tests sharing 2 cores.
  if [[ "$sanitizer" == tsan ]]; then
    BAZEL_FLAGS+=("--test_timeout=1800,9000,27000,108000")
  else
    BAZEL_FLAGS+=("--test_timeout=600,3000,9000,36000")
  fi
  # The same for the jobs the MPI and multihost scripts bound themselves.
  BAZEL_FLAGS+=("--test_env=TESSEL_MPI_TEST_TIMEOUT=6000" "--test_env=MH_TIMEOUT=3000")
  BAZEL_FLAGS+=("--disk_cache=" "--config=$sanitizer" "--symlink_prefix=/"
    "--test_env=TESSEL_CPU_ALLOCATOR=system"
    "--test_env=UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1")
  if [[ "$sanitizer" == asan ]]; then
    # OpenMPI's own allocations (MPI_Init_thread, MPI_Finalize, its progress
    # thread) that it never frees: suppressed by frames of OpenMPI and its
    # libraries only (tools/sanitizers/lsan.supp), so tessel's leaks still fail.
    # Suppressions match modules only in whole stacks: the slow unwinder
    # (OpenMPI is built without frame pointers, the fast one stops at its
    # first frame), and OpenMPI's plugins stay mapped after MPI_Finalize
    # (unmapped, their frames are "<unknown module>"). The slow unwinder
    # doubles a test's time, so only the processes mpirun starts use it:
    # test/mpi_test.sh and the multihost hosts add fast_unwind_on_malloc=0.
    BAZEL_FLAGS+=("--test_env=LSAN_OPTIONS=suppressions=$ROOT/tools/sanitizers/lsan.supp:print_suppressions=0"
      "--test_env=ASAN_OPTIONS=detect_leaks=1"
      "--test_env=OMPI_MCA_mca_base_component_disable_dlclose=1")
  else
    query="kind(cc_test, $query)"
    BAZEL_FLAGS+=("--test_env=TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1")
  fi
fi

targets=$(bazel "${STARTUP[@]}" query "$query" 2>/dev/null | sort)
if [[ -z "$targets" ]]; then
  echo "tessel: no test targets found" >&2
  echo "0 passed, 1 failed, 0 skipped"
  exit 1
fi

echo "tessel: building and running $(echo "$targets" | wc -l) test binaries..." >&2
# Bazel's per-target status decides first: a target that failed to build
# keeps the test.log of its last successful run, which must not count.
status_log="$(mktemp)"
trap 'rm -f "$status_log"' EXIT
bazel "${STARTUP[@]}" test "${BAZEL_FLAGS[@]}" --test_output=errors --keep_going "$@" $targets 2>&1 | tee "$status_log"
bazel_rc=${PIPESTATUS[0]}

passed=0; failed=0; skipped=0
testlogs="$(bazel "${STARTUP[@]}" info "${BAZEL_FLAGS[@]}" bazel-testlogs 2>/dev/null)"
for t in $targets; do
  rel="${t#//}"; rel="${rel/://}"
  log="$testlogs/$rel/test.log"
  line=""
  status=$(grep -a -E "^$t[[:space:]]" "$status_log" | tail -n 1)
  if [[ "$status" != *PASSED* && "$status" != *FAILED\ in* ]]; then
    failed=$((failed + 1))
    echo "FAILED (${status##*  }): $t" >&2
    continue
  fi
  [[ -f "$log" ]] && line=$(grep -a '^\[tessel-summary\]' "$log" | tail -n 1)
  if [[ -n "$line" ]]; then
    p=$(sed -E 's/.*passed=([0-9]+).*/\1/' <<<"$line")
    f=$(sed -E 's/.*failed=([0-9]+).*/\1/' <<<"$line")
    s=$(sed -E 's/.*skipped=([0-9]+).*/\1/' <<<"$line")
    # A binary that printed a clean summary but still exited non-zero (e.g. crashed at exit).
    if [[ "$f" -eq 0 ]] && [[ -f "$testlogs/$rel/test.xml" ]] && grep -q 'failures="[1-9]' "$testlogs/$rel/test.xml"; then
      f=1
    fi
    passed=$((passed + p)); failed=$((failed + f)); skipped=$((skipped + s))
    [[ "$f" -gt 0 ]] && echo "FAILED: $t" >&2
  else
    failed=$((failed + 1))
    echo "FAILED (no summary: build failure or crash): $t" >&2
  fi
done
if [[ -n "$sanitizer" ]]; then
  echo "$passed passed, $failed failed, $skipped skipped"
  [[ $failed -eq 0 && $bazel_rc -eq 0 ]]
  exit
fi
# A workspace of its own that uses tessel as a library (docs/build.md): built
# and run as a user would, one test case.
echo "tessel: building examples/external (a workspace that depends on tessel)..." >&2
ext_log="$(mktemp)"
examples/external/build_and_run.sh > "$ext_log" 2>&1
if grep -a -q '^\[tessel-summary\] passed=1' "$ext_log"; then
  passed=$((passed + 1))
else
  failed=$((failed + 1))
  tail -n 40 "$ext_log" >&2
  echo "FAILED: examples/external" >&2
fi
rm -f "$ext_log"
echo "$passed passed, $failed failed, $skipped skipped"
[[ $failed -eq 0 && $bazel_rc -eq 0 ]]
