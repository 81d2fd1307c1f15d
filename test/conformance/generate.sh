#!/usr/bin/env bash
# Generation and fine-tuning against transformers (./tessel conformance --generate):
# for GPT-2, LLaMA and Mixtral, transformers saves a random model (sharded
# safetensors) and its greedy tokens for 4 prompts; `tessel generate` must
# give exactly those tokens on one device, tp=2 and pp=2. Then the round
# trip: `tessel train --init-from` fine-tunes the saved model 3 steps on
# dp=2,tp=2, `tessel ckpt convert --to hf` exports it, and transformers'
# logits on the export must equal tessel's logits of its checkpoint.
# Needs transformers (tools/python_venv.sh --hf).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
models="${1:-gpt2 llama mixtral}"
tol="${2:-1e-5}"
PY="$(tools/python_venv.sh --hf)"
source tools/bazel_flags.sh
bazel build "${BAZEL_FLAGS[@]}" //tools:tessel //test/conformance:hf_export
TESSEL="$ROOT/bazel-bin/tools/tessel"
HF_EXPORT="$ROOT/bazel-bin/test/conformance/hf_export"
OUT="${TESSEL_CONFORMANCE_OUT:-$(mktemp -d -t tessel-generate.XXXXXX)}/generate"
echo "tessel conformance --generate: outputs in $OUT"
failed=()
for m in $models; do
  echo "$m:"
  d="$OUT/$m"
  rm -rf "$d" && mkdir -p "$d"
  ok=1
  "$PY" test/conformance/generate_check.py save --model "$m" --dir "$d" || ok=0
  if (( ok )); then
    ids=()
    while read -r line; do ids+=(--ids "$line"); done <"$d/prompts.txt"
    n=$("$PY" -c "import json; print(json.load(open('$d/expected.json'))['new_tokens'])")
    for mesh in "" tp=2 pp=2; do
      f="$d/tessel_tokens${mesh:+_$mesh}.jsonl"
      "$TESSEL" generate --from "$d/hf" "${ids[@]}" --max-new-tokens "$n" --ignore-eos --json \
        ${mesh:+--mesh "$mesh"} >"$f" || { ok=0; continue; }
      "$PY" test/conformance/generate_check.py tokens --dir "$d" --tessel "$f" || ok=0
    done
    if "$TESSEL" train --init-from "$d/hf" --mesh dp=2,tp=2 --steps 3 --batch-size 8 --seq-len 32 --lr 3e-3 \
         --warmup-steps 1 --ckpt-every 3 --sample-length 0 --eval-every 0 --out "$d/ft" >"$d/ft.log" 2>&1 &&
       "$TESSEL" ckpt convert --to hf "$d/ft" "$d/ft_hf" >/dev/null &&
       "$HF_EXPORT" logits --from "$d/ft" --batch "$d/batch.safetensors" --out "$d/ft_tessel_logits.safetensors" \
         >/dev/null; then
      "$PY" test/conformance/generate_check.py logits --dir "$d" --tol "$tol" || ok=0
    else
      tail -n 5 "$d/ft.log"
      ok=0
    fi
  fi
  (( ok )) || failed+=("$m")
done
if [[ ${#failed[@]} -eq 0 ]]; then
  echo "tessel conformance --generate: $(wc -w <<<"$models") models: transformers' greedy tokens on 3 layouts, and the fine-tuned round trip within $tol"
  exit 0
fi
echo "tessel conformance --generate: FAILED: ${failed[*]}"
exit 1
