# Sourced by ./tessel and tools/run_tests.sh: common Bazel flags.
# The disk cache lives outside the checkout so fresh clones and CI reuse it.
TESSEL_BAZEL_CACHE="${TESSEL_BAZEL_CACHE:-$HOME/.cache/tessel/bazel-disk}"
mkdir -p "$TESSEL_BAZEL_CACHE"
BAZEL_FLAGS=(
  "--disk_cache=$TESSEL_BAZEL_CACHE"
  "--ui_event_filters=-info,-debug"
  "--noshow_progress"
  "--show_result=0"
)
