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

# cuDNN's header-only C++ frontend (fast-mode fused attention on the GPU),
# from PyPI, only where a CUDA toolkit with cuDNN is installed. Optional:
# without it the build leaves cuDNN attention out (third_party/cuda).
cudnn_frontend() {
  local cuda="${CUDA_PATH:-/usr/local/cuda}"
  local dest="${TESSEL_CUDNN_FRONTEND:-$HOME/.cache/tessel/cudnn_frontend/include}"
  [[ "${TESSEL_NO_CUDA:-}" == "1" || ! -x "$cuda/bin/nvcc" || ! -e "$cuda/include/cudnn.h" ]] && return 0
  [[ -f "$dest/cudnn_frontend.h" ]] && return 0
  command -v python3 >/dev/null || return 0
  local tmp
  tmp=$(mktemp -d)
  if python3 -m pip download -q --no-deps --only-binary=:all: -d "$tmp" "nvidia-cudnn-frontend==1.32.0" \
      >/dev/null 2>&1 && python3 - "$tmp" "$dest" <<'PY'
import glob, os, shutil, sys, zipfile
tmp, dest = sys.argv[1], sys.argv[2]
stage = dest + ".partial"
shutil.rmtree(stage, ignore_errors=True)
with zipfile.ZipFile(glob.glob(os.path.join(tmp, "*.whl"))[0]) as z:
    for n in z.namelist():
        if n.startswith("include/") and not n.endswith("/"):
            target = os.path.join(stage, n[len("include/"):])
            os.makedirs(os.path.dirname(target), exist_ok=True)
            with open(target, "wb") as f:
                f.write(z.read(n))
shutil.rmtree(dest, ignore_errors=True)
os.makedirs(os.path.dirname(dest), exist_ok=True)
os.rename(stage, dest)  # complete or absent
PY
  then
    echo "tessel: cuDNN frontend headers installed in $dest" >&2
  else
    echo "tessel: could not fetch nvidia-cudnn-frontend from PyPI; building without cuDNN attention" >&2
  fi
  rm -rf "$tmp"
}
cudnn_frontend

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
