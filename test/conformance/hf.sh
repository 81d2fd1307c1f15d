#!/usr/bin/env bash
# Hugging Face interop (./tessel conformance --hf): for GPT-2, LLaMA and
# Mixtral (tiny configs), tessel writes HF-named, sharded safetensors and
# transformers must compute tessel's logits from them; then transformers
# saves its own random weights and tessel must compute transformers' logits.
# Needs transformers in the Python environment (tools/python_venv.sh --hf).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
models="${1:-nanogpt llama mixtral}"
tol="${2:-1e-5}"
PY="$(tools/python_venv.sh --hf)"
source tools/bazel_flags.sh
bazel build "${BAZEL_FLAGS[@]}" //test/conformance:hf_export
EXPORT="$ROOT/bazel-bin/test/conformance/hf_export"
OUT="${TESSEL_CONFORMANCE_OUT:-$(mktemp -d -t tessel-hf.XXXXXX)}/hf"
echo "tessel conformance --hf: outputs in $OUT"
failed=()
for m in $models; do
  echo "$m:"
  d="$OUT/$m"
  rm -rf "$d"
  if ! "$EXPORT" export --model "$m" --out "$d" ||
     ! "$PY" test/conformance/hf_check.py export "$d" --tol "$tol" ||
     ! "$EXPORT" import --dir "$d" ||
     ! "$PY" test/conformance/hf_check.py import "$d" --tol "$tol"; then
    failed+=("$m")
  fi
done
if [[ ${#failed[@]} -eq 0 ]]; then
  echo "tessel conformance --hf: $(wc -w <<<"$models") models load both ways with transformers within $tol"
  exit 0
fi
echo "tessel conformance --hf: FAILED: ${failed[*]}"
exit 1
