#!/usr/bin/env bash
# Prints the path of a Python with torch, numpy and safetensors, creating the
# virtual environment on first use (./tessel conformance, ./tessel bench step).
#   TESSEL_VENV   where it lives (default ~/.cache/tessel/venv, outside the checkout)
# PyPI's torch wheel is large (~5 GB with its CUDA libraries) and takes a few
# minutes to install the first time; later runs reuse the environment.
# Progress goes to stderr; stdout is only the interpreter's path.
#   --hf   also Hugging Face transformers (./tessel conformance --hf)
set -euo pipefail
VENV="${TESSEL_VENV:-$HOME/.cache/tessel/venv}"
PY="$VENV/bin/python"
if [[ "${1:-}" == --hf ]]; then
  PY="$("$0")"
  if ! "$PY" -c "import transformers" 2>/dev/null; then
    echo "tessel: installing transformers into $VENV (first time only)..." >&2
    "$PY" -m pip install -q transformers >&2
  fi
  echo "$PY"
  exit 0
fi
if [[ -x "$PY" ]] && "$PY" -c "import torch, numpy, safetensors" 2>/dev/null; then
  echo "$PY"
  exit 0
fi
echo "tessel: creating the Python environment $VENV (torch, numpy, safetensors; first time only)..." >&2
if ! python3 -m venv --help >/dev/null 2>&1 || ! python3 -c "import ensurepip" 2>/dev/null; then
  echo "tessel: installing python3-venv with apt-get" >&2
  if [[ $(id -u) -eq 0 ]]; then apt-get install -y -q python3-venv >&2; else sudo apt-get install -y -q python3-venv >&2; fi
fi
mkdir -p "$(dirname "$VENV")"
[[ -x "$PY" ]] || python3 -m venv "$VENV" >&2
"$PY" -m pip install -q --upgrade pip >&2 || true
"$PY" -m pip install -q torch numpy safetensors >&2
"$PY" -c "import torch, numpy, safetensors" >&2
echo "$PY"
