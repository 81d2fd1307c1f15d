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
#   cases) and the step bench (nanogpt gpt2-124m, fast and bitwise modes;
#   its JSON lines), copies logs to $OUT when set, and ends with one line:
#     gpu_check: tests N passed, M failed, K skipped; bench <status>
#   Extra args go to gpu_tests (e.g. a Catch2 test-name filter).
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

run() {
  if [[ ! -x "$BUNDLE/bin/gpu_tests" ]]; then
    echo "gpu_check: $BUNDLE/bin/gpu_tests is missing: run 'tools/gpu_check.sh bundle' here and carry gpu_bundle" >&2
    echo "gpu_check: tests 0 passed, 1 failed, 0 skipped; bench not run"
    exit 1
  fi
  local out="${OUT:-$BUNDLE/out}"
  mkdir -p "$out"
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
  nv=$(python3 -c 'import glob, os, nvidia; print(":".join(sorted({os.path.dirname(p) for d in nvidia.__path__ for p in glob.glob(d + "/*/lib/lib*.so*")})))' 2>/dev/null || true)
  [[ -n "$nv" ]] && libpath="$libpath:$nv"
  export LD_LIBRARY_PATH="$libpath${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  local missing
  missing=$(ldd "$BUNDLE/bin/gpu_tests" "$BUNDLE/bin/bench_step_cuda" 2>&1 | grep "not found" | sort -u)
  if [[ -n "$missing" ]]; then
    echo "gpu_check: libraries not found on this machine:"
    echo "$missing"
    echo "gpu_check: carry them (e.g. copy them into gpu_bundle/lib before the run) or point CUDA_PATH at a toolkit"
  fi
  echo "== gpu_tests =="
  "$BUNDLE/bin/gpu_tests" "$@" 2>&1 | tee "$out/gpu_tests.log"
  local summary
  summary=$(grep -a '^\[tessel-summary\]' "$out/gpu_tests.log" | tail -n 1)
  local p=0 f=1 s=0
  if [[ -n "$summary" ]]; then
    p=$(sed -E 's/.*passed=([0-9]+).*/\1/' <<<"$summary")
    f=$(sed -E 's/.*failed=([0-9]+).*/\1/' <<<"$summary")
    s=$(sed -E 's/.*skipped=([0-9]+).*/\1/' <<<"$summary")
  fi
  echo "== bench_step_cuda =="
  local bench_status="ok"
  for gemm in fast bitwise; do
    local ref=()
    [[ "$gemm" == bitwise ]] && ref=(--no-reference)
    if ! "$BUNDLE/bin/bench_step_cuda" --model nanogpt --config gpt2-124m --device cuda --gemm "$gemm" \
        --steps 10 --warmup 3 --torch-script "$BUNDLE/bin/step_cuda_torch.py" "${ref[@]}" 2>&1 |
        tee "$out/bench_step_cuda_$gemm.log"; then
      bench_status="failed ($gemm)"
    fi
    grep -a '^{' "$out/bench_step_cuda_$gemm.log" | tail -n 1 > "$out/bench_step_cuda_$gemm.json"
  done
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
