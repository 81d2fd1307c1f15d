#!/usr/bin/env bash
# No Catch2 assertion runs on a rank (tools/lint/asserts_on_ranks.py).
set -euo pipefail
script="$1"; shift
exec python3 "$script" "$@"
