#!/usr/bin/env bash
# tokenizer.json conformance (./tessel conformance --tokenizers): PyPI's
# `tokenizers` builds byte-level (GPT-2, LLaMA-3) and SentencePiece-style
# (LLaMA-2, three spellings) BPE tokenizer.json files by training on the
# default corpus, then tessel's HfTokenizer (test/conformance/tokenize) must
# give the same ids and the same decoded text, token for token
# (tokenizers_check.py). Needs the Hugging Face venv (tools/python_venv.sh --hf).
#   test/conformance/tokenizers.sh [--corpus PATH] [--only gpt2,llama3,...] [-v]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
PY="$(tools/python_venv.sh --hf)"
source tools/bazel_flags.sh
bazel build "${BAZEL_FLAGS[@]}" //test/conformance:tokenize
OUT="${TESSEL_CONFORMANCE_OUT:-$(mktemp -d -t tessel-tokenizers.XXXXXX)}/tokenizers"
mkdir -p "$OUT"
echo "tessel conformance --tokenizers: outputs in $OUT"
exec "$PY" test/conformance/tokenizers_check.py --exe "$ROOT/bazel-bin/test/conformance/tokenize" --out "$OUT" "$@"
