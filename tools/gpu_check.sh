#!/usr/bin/env bash
# GPU checks for a machine that has a GPU and CUDA but no Bazel (docs/cuda.md).
#
#   tools/gpu_check.sh bundle      # here (with Bazel): build and pack gpu_bundle/
#   tools/gpu_check.sh run [args]  # on the GPU machine: run the CUDA tests and the step bench
#
# bundle: builds //test:gpu_tests (every test_*_cuda.cc in one statically
#   linked binary) and //tools/bench:bench_step_cuda, strips them and copies
#   the shared libraries they need (from ldd) into gpu_bundle/lib -- except the
#   driver (libcuda, libnvidia-*), glibc's own libraries and the CUDA toolkit's
#   libraries under $CUDA_PATH (cuBLAS/cuBLASLt are hundreds of MiB; the GPU
#   machine is assumed to have the same toolkit major version, see below).
#   gpu_bundle/MANIFEST lists every library and where it is expected to come
#   from. The bundle must stay under the device tool's 64 MiB carry limit; the
#   script fails if it does not.
# run: prints the GPU (nvidia-smi), resolves the libraries (bundle first,
#   then the toolkit's lib64 dirs found on the machine) and says which are
#   missing, runs gpu_tests (Catch2; its [tessel-summary] line counts test
#   cases) and the step bench (nanogpt gpt2-124m in fast mode, which also times
#   bitwise mode and tessel::Run eager against compile mode with and without
#   CUDA graphs; its JSON line and compile mode's lines),
#   copies logs to $OUT when set, and ends with one line:
#     gpu_check: tests N passed, M failed, K skipped; bench <status>
#   Extra args are Catch2 test-name filters (wildcards allowed; a case
#   matching any of them runs; none matching is an error);
#   GPU_CHECK_SKIP_TESTS=1 runs the bench alone, GPU_CHECK_SKIP_BENCH=1 the tests alone;
#   GPU_CHECK_SANITIZER=memcheck (racecheck, initcheck, synccheck) runs each
#   test case under NVIDIA's compute-sanitizer (bundle with 'bundle --sanitizer'),
#   a report making the case SANITIZER(<tool>); GPU_CHECK_SANITIZER_ARGS adds
#   options (initcheck needs "--check-bulk-copy yes" to see TMA stores, which
#   cuBLASLt and cuDNN use on Hopper: without it their outputs read as uninitialized);
#   GPU_CHECK_BENCH_ARGS adds arguments to the bench (e.g. "--profile
#   --no-reference --no-bitwise-cost" with CUDA_LAUNCH_BLOCKING=1: GPU time per op). Each test case runs in its
#   own process (GPU_CHECK_JOBS at a time, default 4; GPU_CHECK_TEST_TIMEOUT
#   s each, default 90; none starts after GPU_CHECK_TEST_BUDGET s, default
#   180: those are NOTRUN and count as failed); the bench is limited to
#   GPU_CHECK_BENCH_TIMEOUT s (default 180).
#
# Through the device tool, from the repository root (the tool copies the
# working tree plus the named ignored paths):
#   tools/gpu_check.sh bundle
#   run(command="tools/gpu_check.sh run", carry=["gpu_bundle"], timeout_s=600)
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
BUNDLE="$ROOT/gpu_bundle"
LIMIT_MIB=60

bundle() {
  set -e
  source tools/bazel_flags.sh
  echo "gpu_check: building //test:gpu_tests //tools/bench:bench_step_cuda" >&2
  bazel build "${BAZEL_FLAGS[@]}" //test:gpu_tests //tools/bench:bench_step_cuda
  local cuda_root="${CUDA_PATH:-/usr/local/cuda}"
  cuda_root="$(readlink -f "$cuda_root")"
  rm -rf "$BUNDLE"
  mkdir -p "$BUNDLE/bin" "$BUNDLE/lib"
  cp bazel-bin/test/gpu_tests bazel-bin/tools/bench/bench_step_cuda "$BUNDLE/bin/"
  cp tools/bench/step_cuda_torch.py "$BUNDLE/bin/"
  chmod u+w "$BUNDLE/bin/"*
  strip --strip-unneeded "$BUNDLE/bin/gpu_tests" "$BUNDLE/bin/bench_step_cuda"
  : > "$BUNDLE/MANIFEST"
  local lib path real
  while read -r lib path; do
    [[ -z "$lib" ]] && continue
    case "$lib" in
      linux-vdso*|ld-linux*|libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|libresolv.so*) continue ;;
      libcuda.so*|libnvidia*) echo "$lib driver (the GPU machine's)" >> "$BUNDLE/MANIFEST"; continue ;;
    esac
    real="$(readlink -f "$path")"
    if [[ "$real" == "$cuda_root"/* ]]; then
      echo "$lib toolkit ($real; expected under the GPU machine's CUDA lib64)" >> "$BUNDLE/MANIFEST"
      continue
    fi
    cp -L "$path" "$BUNDLE/lib/$lib"
    echo "$lib bundled (from $real)" >> "$BUNDLE/MANIFEST"
  done < <(ldd "$BUNDLE/bin/gpu_tests" "$BUNDLE/bin/bench_step_cuda" | awk '/=>/ && $3 ~ /^\// {print $1, $3}' | sort -u)
  if [[ "${1:-}" == "--sanitizer" ]]; then
    # NVIDIA's compute-sanitizer from PyPI (the toolkit here has none), packed
    # small: its 32-bit helpers and docs are dropped.
    local cache="${XDG_CACHE_HOME:-$HOME/.cache}/tessel/compute-sanitizer"
    mkdir -p "$cache"
    if ! ls "$cache"/nvidia_cuda_sanitizer_api-13*.whl >/dev/null 2>&1; then
      python3 -m pip download --no-deps -d "$cache" 'nvidia-cuda-sanitizer-api>=13,<14' >&2
    fi
    local tmp
    tmp="$(mktemp -d)"
    (cd "$tmp" && unzip -q "$(ls "$cache"/nvidia_cuda_sanitizer_api-13*.whl | tail -n 1)" 'nvidia/cu13/compute-sanitizer/*' &&
      rm -rf nvidia/cu13/compute-sanitizer/{x86,docs,include} &&
      tar cJf "$BUNDLE/compute-sanitizer.tar.xz" -C nvidia/cu13 compute-sanitizer)
    rm -rf "$tmp"
    echo "compute-sanitizer.tar.xz bundled (nvidia-cuda-sanitizer-api from PyPI)" >> "$BUNDLE/MANIFEST"
  fi
  (cd "$ROOT" && git rev-parse HEAD 2>/dev/null || echo unknown) > "$BUNDLE/COMMIT"
  local size
  size=$(du -sm "$BUNDLE" | cut -f1)
  echo "gpu_check: bundle $BUNDLE: ${size} MiB (limit ${LIMIT_MIB} MiB)" >&2
  cat "$BUNDLE/MANIFEST" >&2
  du -h "$BUNDLE"/bin/* "$BUNDLE"/lib/* 2>/dev/null >&2
  if (( size > LIMIT_MIB )); then
    echo "gpu_check: the bundle is too large for the device tool's carry limit" >&2
    exit 1
  fi
}

# One test case in its own process (a crash or a hang loses only that case):
# writes "<status> <seconds> <name>" to $3 and the case's output to $4.
run_one_test() {
  local name="$1" deadline="$2" result="$3" log="$4"
  if (( $(date +%s) >= deadline )); then
    echo "NOTRUN 0 $name" > "$result"
    return 0
  fi
  # Catch2 v2 test specs: ',' separates alternatives, '[' starts a tag, '\' escapes.
  local spec
  spec=$(sed -e 's/\\/\\\\/g' -e 's/,/\\,/g' -e 's/\[/\\[/g' -e 's/\]/\\]/g' <<<"$name")
  local t0 rc status
  t0=$(date +%s)
  local wrap=()
  [[ -n "${GPU_CHECK_SANITIZER:-}" ]] &&
    wrap=("$BUNDLE/cs/compute-sanitizer/compute-sanitizer" --tool "$GPU_CHECK_SANITIZER" --error-exitcode 99 --print-limit 20 ${GPU_CHECK_SANITIZER_ARGS:-})
  timeout -k 5 "${GPU_CHECK_TEST_TIMEOUT:-90}" "${wrap[@]}" "$BUNDLE/bin/gpu_tests" "$spec" > "$log" 2>&1
  rc=$?
  local summary
  summary=$(grep -a '^\[tessel-summary\]' "$log" | tail -n 1)
  if (( rc == 124 || rc == 137 )); then
    status=TIMEOUT
  elif (( rc == 99 )) && [[ -n "${GPU_CHECK_SANITIZER:-}" ]]; then
    status="SANITIZER($GPU_CHECK_SANITIZER)"
  elif [[ -z "$summary" ]]; then
    status="CRASH(rc=$rc)"
  elif [[ "$summary" == *"failed=0"* && "$summary" == *"skipped=1"* ]]; then
    status=SKIP
  elif [[ "$summary" == *"passed=1"* ]]; then
    status=PASS
  elif [[ "$summary" == *"passed=0 failed=0"* ]]; then
    status="NOMATCH"
  else
    status=FAIL
  fi
  echo "$status $(( $(date +%s) - t0 )) $name" > "$result"
}

run() {
  if [[ ! -x "$BUNDLE/bin/gpu_tests" ]]; then
    echo "gpu_check: $BUNDLE/bin/gpu_tests is missing: run 'tools/gpu_check.sh bundle' here and carry gpu_bundle" >&2
    echo "gpu_check: tests 0 passed, 1 failed, 0 skipped; bench not run"
    exit 1
  fi
  local out="${OUT:-$BUNDLE/out}"
  mkdir -p "$out"
  local t_start
  t_start=$(date +%s)
  echo "gpu_check: bundle of commit $(cat "$BUNDLE/COMMIT" 2>/dev/null)"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | sed 's/^/gpu: /'
  # Libraries: the bundle first, then every CUDA lib64 on this machine.
  local libpath="$BUNDLE/lib"
  for d in ${CUDA_PATH:-} /usr/local/cuda /usr/local/cuda-13* /usr/local/cuda-12* /usr/lib/x86_64-linux-gnu; do
    for sub in lib64 targets/x86_64-linux/lib lib; do
      [[ -d "$d/$sub" ]] && libpath="$libpath:$d/$sub"
    done
  done
  # cuDNN and NVRTC (cuDNN attention) where the toolkit lacks them: the ones
  # PyTorch's wheels carry (site-packages/nvidia/*/lib).
  local nv
  nv=$(python3 -c 'import glob, os, nvidia; print(":".join(sorted({os.path.dirname(p) for d in nvidia.__path__ for p in glob.glob(d + "/*/lib/lib*.so*") + glob.glob(d + "/*/lib64/lib*.so*") + glob.glob(d + "/lib/lib*.so*")})))' 2>/dev/null || true)
  [[ -n "$nv" ]] && libpath="$libpath:$nv"
  export LD_LIBRARY_PATH="$libpath${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  local missing
  missing=$(ldd "$BUNDLE/bin/gpu_tests" "$BUNDLE/bin/bench_step_cuda" 2>&1 | grep "not found" | sort -u)
  if [[ -n "$missing" ]]; then
    echo "gpu_check: libraries not found on this machine:"
    echo "$missing"
    echo "gpu_check: carry them (e.g. copy them into gpu_bundle/lib before the run) or point CUDA_PATH at a toolkit"
  fi

  if [[ -n "${GPU_CHECK_SANITIZER:-}" ]]; then
    if [[ ! -f "$BUNDLE/compute-sanitizer.tar.xz" ]]; then
      echo "gpu_check: GPU_CHECK_SANITIZER needs a bundle built with 'tools/gpu_check.sh bundle --sanitizer'"
      echo "gpu_check: tests 0 passed, 1 failed, 0 skipped; bench not run"
      exit 1
    fi
    mkdir -p "$BUNDLE/cs" && tar xJf "$BUNDLE/compute-sanitizer.tar.xz" -C "$BUNDLE/cs"
    echo "gpu_check: every test case under compute-sanitizer --tool $GPU_CHECK_SANITIZER"
    export GPU_CHECK_SANITIZER
  fi
  local p=0 f=0 s=0
  if [[ "${GPU_CHECK_SKIP_TESTS:-0}" == 1 ]]; then
    echo "== gpu_tests skipped (GPU_CHECK_SKIP_TESTS=1) =="
  else
  echo "== gpu_tests (one process per test case, ${GPU_CHECK_JOBS:-4} at a time) =="
  local work="$out/.work"
  rm -rf "$work"
  mkdir -p "$work"
  local names=()
  # Several filters select the cases any of them matches (Catch2 ANDs separate
  # arguments and ORs the comma-separated alternatives of one).
  local filter=()
  if [[ $# -gt 0 ]]; then
    local joined
    joined=$(IFS=,; echo "$*")
    filter=("$joined")
  fi
  mapfile -t names < <("$BUNDLE/bin/gpu_tests" --list-test-names-only "${filter[@]}" | sed -e '/^$/d' -e 's/^ *//' | grep -v 'matching test case')
  if [[ ${#names[@]} -eq 0 ]]; then
    echo "gpu_check: no test case matches ${filter[*]:-(all)}"
    echo "gpu_check: tests 0 passed, 1 failed, 0 skipped; bench not run"
    exit 1
  fi
  echo "gpu_check: ${#names[@]} test cases"
  local deadline=$(( t_start + ${GPU_CHECK_TEST_BUDGET:-180} ))
  export -f run_one_test
  export BUNDLE GPU_CHECK_TEST_TIMEOUT GPU_CHECK_SANITIZER_ARGS
  local i=${#names[@]} k
  for (( k = 0; k < i; k++ )); do
    printf '%s\0%s\0' "$k" "${names[$k]}"
  done | xargs -0 -r -n 2 -P "${GPU_CHECK_JOBS:-4}" bash -c 'run_one_test "$2" '"$deadline"' "'"$work"'/$1.result" "'"$work"'/$1.log"' _
  local j status secs name
  : > "$out/gpu_tests.log"
  : > "$out/gpu_tests_results.txt"
  for (( j = 0; j < i; j++ )); do
    read -r status secs name < "$work/$j.result" || { status=LOST; secs=0; name="${names[$j]}"; }
    echo "$status ${secs}s $name" >> "$out/gpu_tests_results.txt"
    { echo "===== [$status ${secs}s] $name"; cat "$work/$j.log" 2>/dev/null; } >> "$out/gpu_tests.log"
    case "$status" in
      PASS) p=$((p + 1)) ;;
      SKIP) s=$((s + 1)) ;;
      *) f=$((f + 1)) ;;
    esac
  done
  cat "$out/gpu_tests_results.txt"
  echo "== failures (first lines of each) =="
  for (( j = 0; j < i; j++ )); do
    read -r status secs name < "$work/$j.result" 2>/dev/null || status=LOST
    case "$status" in PASS|SKIP) continue ;; esac
    echo "--- [$status] ${names[$j]}"
    grep -a -v '^\[tessel-summary\]\|^=\+$\|^-\+$\|^~\+$\|^Randomness seeded\|^test cases:\|^assertions:\|^All tests passed\|^gpu_tests is a Catch' "$work/$j.log" 2>/dev/null |
      grep -a -v '^\s*$' | head -n "${GPU_CHECK_FAIL_LINES:-14}" | cut -c1-300
  done
  rm -rf "$work"
  fi

  # The step bench in fast mode; it also times the same steps with the
  # bitwise GEMM ("bitwise": {"cost"}) and PyTorch eager / torch.compile.
  local bench_status="ok"
  if [[ "${GPU_CHECK_SKIP_BENCH:-0}" == 1 ]]; then
    echo "== bench_step_cuda skipped (GPU_CHECK_SKIP_BENCH=1) =="
    bench_status="skipped"
  else
    echo "== bench_step_cuda =="
    timeout -k 5 "${GPU_CHECK_BENCH_TIMEOUT:-180}" "$BUNDLE/bin/bench_step_cuda" --model nanogpt --config gpt2-124m \
        --device cuda --gemm fast --steps 10 --warmup 3 --torch-script "$BUNDLE/bin/step_cuda_torch.py" \
        ${GPU_CHECK_BENCH_ARGS:-} > "$out/bench_step_cuda.log" 2>&1
    local rc=$?
    (( rc != 0 )) && bench_status="failed (rc=$rc)"
    grep -a -v '^{' "$out/bench_step_cuda.log" | tail -n 12 | cut -c1-300
    # Compile mode's lines (eager / compiled / CUDA graphs / the step's parts), wherever they fell.
    echo "-- compile mode --"
    grep -a -E '^tessel::Run |^  CUDA graphs: |^  parts |^compile mode comparison failed' "$out/bench_step_cuda.log" | cut -c1-400
    grep -a '^{' "$out/bench_step_cuda.log" | tail -n 1 | tee "$out/bench_step_cuda.json"
  fi
  echo "gpu_check: $(( $(date +%s) - t_start )) s"
  echo "gpu_check: tests $p passed, $f failed, $s skipped; bench $bench_status"
  [[ "$f" == 0 ]]
}

case "${1:-}" in
  bundle) shift; bundle "$@" ;;
  run) shift; run "$@" ;;
  *)
    sed -n '2,30p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
    ;;
esac
