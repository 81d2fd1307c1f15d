#!/usr/bin/env bash
# Runs every test target and prints one summary line:
#   N passed, M failed, K skipped
# N/M/K count test cases (Catch2 TEST_CASEs, via the "[tessel-summary]" line each
# binary prints). A target that fails to build, crashes, or prints no summary
# counts as one failed test. Extra arguments go to `bazel test`. Last, the
# workspace examples/external (tessel as a library) is built and run: one
# more test case.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
source tools/bazel_flags.sh

targets=$(bazel query 'tests(//...) except attr(tags, "manual", //...)' 2>/dev/null | sort)
if [[ -z "$targets" ]]; then
  echo "tessel: no test targets found" >&2
  echo "0 passed, 1 failed, 0 skipped"
  exit 1
fi

echo "tessel: building and running $(echo "$targets" | wc -l) test binaries..." >&2
# Bazel's per-target status decides first: a target that failed to build
# keeps the test.log of its last successful run, which must not count.
status_log="$(mktemp)"
trap 'rm -f "$status_log"' EXIT
bazel test "${BAZEL_FLAGS[@]}" --test_output=errors --keep_going "$@" $targets 2>&1 | tee "$status_log"
bazel_rc=${PIPESTATUS[0]}

passed=0; failed=0; skipped=0
testlogs="$(bazel info "${BAZEL_FLAGS[@]}" bazel-testlogs 2>/dev/null)"
for t in $targets; do
  rel="${t#//}"; rel="${rel/://}"
  log="$testlogs/$rel/test.log"
  line=""
  status=$(grep -a -E "^$t[[:space:]]" "$status_log" | tail -n 1)
  if [[ "$status" != *PASSED* && "$status" != *FAILED\ in* ]]; then
    failed=$((failed + 1))
    echo "FAILED (${status##*  }): $t" >&2
    continue
  fi
  [[ -f "$log" ]] && line=$(grep -a '^\[tessel-summary\]' "$log" | tail -n 1)
  if [[ -n "$line" ]]; then
    p=$(sed -E 's/.*passed=([0-9]+).*/\1/' <<<"$line")
    f=$(sed -E 's/.*failed=([0-9]+).*/\1/' <<<"$line")
    s=$(sed -E 's/.*skipped=([0-9]+).*/\1/' <<<"$line")
    # A binary that printed a clean summary but still exited non-zero (e.g. crashed at exit).
    if [[ "$f" -eq 0 ]] && [[ -f "$testlogs/$rel/test.xml" ]] && grep -q 'failures="[1-9]' "$testlogs/$rel/test.xml"; then
      f=1
    fi
    passed=$((passed + p)); failed=$((failed + f)); skipped=$((skipped + s))
    [[ "$f" -gt 0 ]] && echo "FAILED: $t" >&2
  else
    failed=$((failed + 1))
    echo "FAILED (no summary: build failure or crash): $t" >&2
  fi
done
# A workspace of its own that uses tessel as a library (docs/build.md): built
# and run as a user would, one test case.
echo "tessel: building examples/external (a workspace that depends on tessel)..." >&2
ext_log="$(mktemp)"
examples/external/build_and_run.sh > "$ext_log" 2>&1
if grep -a -q '^\[tessel-summary\] passed=1' "$ext_log"; then
  passed=$((passed + 1))
else
  failed=$((failed + 1))
  tail -n 40 "$ext_log" >&2
  echo "FAILED: examples/external" >&2
fi
rm -f "$ext_log"
echo "$passed passed, $failed failed, $skipped skipped"
[[ $failed -eq 0 && $bazel_rc -eq 0 ]]
