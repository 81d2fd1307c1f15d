#!/usr/bin/env python3
"""Fails when a Catch2 assertion runs inside a rank's function.

The local backend runs ranks as threads, and Catch2's assertions (CHECK,
REQUIRE, INFO, ...) are not thread-safe: two ranks asserting at once corrupt
its state, and the test crashes now and then, far from the cause (malloc
aborts, bad_alloc). Code on a rank reports instead (test/util/dist.h:
on_ranks, RankReport) and the test checks the reports afterwards.

Usage: asserts_on_ranks.py FILE...   (prints each offence; exit 1 if any)
"""
import re
import sys

RANK_CALL = re.compile(r"\b(run_local|on_ranks|errors_on_ranks|launch)\s*\(")
ASSERT = re.compile(r"\b(CHECK\w*|REQUIRE\w*|INFO|CAPTURE|FAIL|FAIL_CHECK|WARN|SUCCEED|SECTION)\s*\(")


def lambda_body(src, start):
    """The text of the first {...} block at or after `start` (braces matched)."""
    i = src.find("{", start)
    if i < 0:
        return ""
    depth = 0
    for j in range(i, len(src)):
        if src[j] == "{":
            depth += 1
        elif src[j] == "}":
            depth -= 1
            if depth == 0:
                return src[i:j]
    return src[i:]


def offences(path):
    src = open(path, encoding="utf-8").read()
    # Comments and string literals are not code.
    src = re.sub(r"//[^\n]*", lambda m: " " * len(m.group(0)), src)
    src = re.sub(r'"(\\.|[^"\\\n])*"', lambda m: '"' + " " * (len(m.group(0)) - 2) + '"', src)
    for call in RANK_CALL.finditer(src):
        body = lambda_body(src, call.end())
        names = sorted({a.group(1) for a in ASSERT.finditer(body)})
        if names:
            line = src.count("\n", 0, call.start()) + 1
            yield (f"{path}:{line}: {', '.join(names)} inside {call.group(1)}(...): "
                   "ranks are threads; report instead (test/util/dist.h)")


def main(paths):
    found = [o for p in paths for o in offences(p)]
    for o in found:
        print(o)
    print(f"asserts_on_ranks: {len(paths)} files, {len(found)} offences")
    # One test case, counted by tools/run_tests.sh like a Catch2 binary's.
    print(f"[tessel-summary] passed={0 if found else 1} failed={1 if found else 0} skipped=0")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
