#!/usr/bin/env bash
# Runs an example program as a test (examples/defs.bzl): the program checks
# its own results and exits non-zero when one is wrong. Prints the summary
# line that tools/run_tests.sh counts. The program's first argument is a
# scratch folder.
set -uo pipefail
bin="$1"
shift
work="${TEST_TMPDIR:-$(mktemp -d)}/work"
mkdir -p "$work"
if "$bin" "$work/ckpt" "$@"; then
  echo "[tessel-summary] passed=1 failed=0 skipped=0"
else
  echo "[tessel-summary] passed=0 failed=1 skipped=0"
  exit 1
fi
