#!/usr/bin/env bash
# libFuzzer on the checkpoint readers (not part of ./tessel test):
#   tools/fuzz.sh [SECONDS_PER_TARGET]      default 120
# Builds tools/fuzz/fuzz_{safetensors,metadata}.cc with clang
# (-fsanitize=fuzzer,address,undefined) together with the runtime and
# checkpoint sources they need, seeds each from tools/fuzz/corpus/, runs it
# for the given time and prints libFuzzer's last status line. Installs clang
# with apt-get if missing. Exit status 0: no crash, leak, hang (>10 s) or
# sanitizer report. docs/checkpoint.md records a run.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
secs="${1:-120}"
if ! command -v clang++ >/dev/null || ! echo 'extern "C" int LLVMFuzzerTestOneInput(const char*, long){return 0;}' |
     clang++ -x c++ -fsanitize=fuzzer - -o /dev/null 2>/dev/null; then
  echo "fuzz.sh: installing clang (libFuzzer) with apt-get" >&2
  apt-get install -y -q clang >&2
fi
OUT="${TESSEL_FUZZ_OUT:-$HOME/.cache/tessel/fuzz}"
mkdir -p "$OUT"
CXXFLAGS=(-std=c++17 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined
          -I. -DSPDLOG_SHARED_LIB -DSPDLOG_COMPILED_LIB -DSPDLOG_FMT_EXTERNAL)
SRCS=(runtime/*.cc checkpoint/safetensors.cc checkpoint/atomic_write.cc checkpoint/metadata.cc checkpoint/crc32c.cc)
SRCS=(${SRCS[@]/runtime\/mesh.cc/})
# The runtime and checkpoint objects once, then one binary per target.
objs=()
mkdir -p "$OUT/obj"
for s in "${SRCS[@]}"; do
  o="$OUT/obj/$(echo "$s" | tr / _).o"
  if [[ ! -f "$o" || "$s" -nt "$o" ]]; then
    clang++ "${CXXFLAGS[@]/-fsanitize=fuzzer,address,undefined/-fsanitize=fuzzer-no-link,address,undefined}" -c "$s" -o "$o"
  fi
  objs+=("$o")
done
status=0
for target in safetensors metadata; do
  bin="$OUT/fuzz_$target"
  clang++ "${CXXFLAGS[@]}" "tools/fuzz/fuzz_$target.cc" "${objs[@]}" -lfmt -lspdlog -pthread -o "$bin"
  corpus="$OUT/corpus_$target"
  mkdir -p "$corpus"
  cp -n tools/fuzz/corpus/"$target"/* "$corpus"/ 2>/dev/null || true
  echo "fuzz_$target: ${secs}s"
  log="$OUT/fuzz_$target.log"
  if "$bin" "$corpus" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -max_len=65536 \
       -print_final_stats=1 >"$log" 2>&1; then
    grep -E "^#[0-9]+.*(DONE|pulse)" "$log" | tail -n 1
    grep -E "stat::number_of_executed_units|stat::peak_rss_mb" "$log"
  else
    status=1
    echo "fuzz_$target: FAILED (see $log)"
    grep -E "ERROR|SUMMARY|Test unit written" "$log" | head -5
  fi
done
exit $status
