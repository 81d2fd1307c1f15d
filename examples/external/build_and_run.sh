#!/usr/bin/env bash
# Builds and runs this workspace the way a user of tessel would (CPU-only, so
# the check does not compile the CUDA kernels a second time). Called by
# tools/run_tests.sh; prints one "[tessel-summary]" line.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
source ../../tools/bazel_flags.sh
if bazel build "${BAZEL_FLAGS[@]}" --repo_env=TESSEL_NO_CUDA=1 //:my_program && bazel-bin/my_program; then
  echo "[tessel-summary] passed=1 failed=0 skipped=0"
else
  echo "[tessel-summary] passed=0 failed=1 skipped=0"
  exit 1
fi
