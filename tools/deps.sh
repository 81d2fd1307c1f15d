#!/usr/bin/env bash
# Installs the Debian packages tessel needs, once. Silent when nothing is missing.
set -euo pipefail

PACKAGES=(
  bazel-bootstrap       # Bazel 4.2 (WORKSPACE mode, offline)
  g++
  libfmt-dev
  libspdlog-dev
  libeigen3-dev
  catch2                # Catch2 v2 (single header)
  nlohmann-json3-dev
  libcli11-dev
  libtomlplusplus-dev
  libopenmpi-dev
  openmpi-bin
  libopenblas-dev       # benchmark reference only
  fortunes              # the default training corpus (real English text)
)

missing=()
for p in "${PACKAGES[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
  [[ "$status" == "install ok installed" ]] || missing+=("$p")
done
[[ ${#missing[@]} -eq 0 ]] && exit 0

echo "tessel: installing missing packages: ${missing[*]}" >&2
SUDO=""
if [[ $(id -u) -ne 0 ]]; then
  command -v sudo >/dev/null || { echo "tessel: need root (or sudo) to install: ${missing[*]}" >&2; exit 1; }
  SUDO="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq >/dev/null
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "tessel: packages installed" >&2
