#!/usr/bin/env bash
# The conformance suite against PyTorch (CPU, float32): for each model's tiny
# config, tessel exports weights, a batch, its logits, loss, gradients and the
# losses of 10 AdamW steps (test/conformance/export.cc); a plain PyTorch
# reference (reference.py) loads the same weights by tessel's paths and
# compares within 1e-5 relative. Run through `./tessel conformance`.
#   ./tessel conformance [--models "nanogpt llama"] [--config tiny] [--tol 1e-5] [-v] [--float64-check]
#   ./tessel conformance [--models ...] [--tol ...] --hf   Hugging Face weights both ways (test/conformance/hf.sh)
#   ./tessel conformance [--tol ...] --generate             greedy generation and a fine-tuning round trip
#                                                           against transformers (test/conformance/generate.sh)
#   ./tessel conformance --tokenizers [--only gpt2,llama3] [-v]   tokenizer.json against PyPI's tokenizers (tokenizers.sh)
# Exit status: 0 when every model passes.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"

models="nanogpt llama mixtral"
config="tiny"
tol="1e-5"
extra=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --models) models="$2"; shift 2 ;;
    --config) config="$2"; shift 2 ;;
    --tol) tol="$2"; shift 2 ;;
    -v|--verbose) extra+=(-v); shift ;;
    --float64-check) extra+=(--float64-check); shift ;;
    --hf) exec test/conformance/hf.sh "$models" "$tol" ;;
    --tokenizers) shift; exec test/conformance/tokenizers.sh "$@" ;;
    --generate) exec test/conformance/generate.sh "${GEN_MODELS:-gpt2 llama mixtral}" "$tol" ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    *) echo "conformance: unknown argument '$1'" >&2; exit 2 ;;
  esac
done

PY="$(tools/python_venv.sh)"
source tools/bazel_flags.sh
bazel build "${BAZEL_FLAGS[@]}" //test/conformance:export
EXPORT="$ROOT/bazel-bin/test/conformance/export"

OUT="${TESSEL_CONFORMANCE_OUT:-$(mktemp -d -t tessel-conformance.XXXXXX)}"
echo "tessel conformance: outputs in $OUT"
failed=()
for m in $models; do
  echo
  if ! "$EXPORT" --model "$m" --config "$config" --out "$OUT/$m"; then
    failed+=("$m (export)")
    continue
  fi
  # Threads do not change tessel's bits; they may change PyTorch's rounding, which the tolerance absorbs.
  if ! "$PY" test/conformance/reference.py "$OUT/$m" --tol "$tol" --json "$OUT/$m/result.json" "${extra[@]}"; then
    failed+=("$m")
  fi
done

echo
n=$(wc -w <<<"$models")
if [[ ${#failed[@]} -eq 0 ]]; then
  echo "tessel conformance: $n of $n models match PyTorch within $tol"
  exit 0
fi
echo "tessel conformance: FAILED: ${failed[*]}"
exit 1
