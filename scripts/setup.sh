#!/usr/bin/env bash
# Installs what the project needs on a fresh Debian/Ubuntu machine. Idempotent: quiet when
# everything is already there. The CUDA toolkit is not installed here (it is large and
# version-specific); the script checks for nvcc and says what to do when it is missing.
#
#   scripts/setup.sh            build + test dependencies (CMake, make, g++, Eigen, doctest, python3)
#   scripts/setup.sh --notebooks  also Jupyter, matplotlib and pandas (for notebooks/)
set -euo pipefail

want_notebooks=0
for arg in "$@"; do
  case "$arg" in
    --notebooks) want_notebooks=1 ;;
    -h|--help) sed -n '2,8p' "$0"; exit 0 ;;
    *) echo "setup.sh: unknown option '$arg' (try --help)" >&2; exit 2 ;;
  esac
done

packages=(cmake make g++ libeigen3-dev doctest-dev python3)
[ "$want_notebooks" = 1 ] && packages+=(python3-pip)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "setup.sh: installing ${missing[*]}"
  sudo=""; [ "$(id -u)" = 0 ] || sudo="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

if [ "$want_notebooks" = 1 ]; then
  if ! python3 -c 'import jupyter, nbconvert, nbformat, matplotlib, pandas' 2>/dev/null; then
    echo "setup.sh: installing Jupyter, matplotlib and pandas (pip)"
    requirements="$(dirname "$0")/../notebooks/requirements.txt"
    # A distribution's own Python refuses pip (PEP 668, "externally managed"); these are
    # leaf packages for the notebooks, so install them beside the system's anyway.
    python3 -m pip install -q -r "$requirements" 2>/dev/null ||
      python3 -m pip install -q --break-system-packages -r "$requirements"
  fi
fi

if ! command -v nvcc >/dev/null 2>&1; then
  for d in /usr/local/cuda/bin /opt/cuda/bin; do
    if [ -x "$d/nvcc" ]; then
      echo "setup.sh: nvcc is in $d but not on PATH; run: export PATH=$d:\$PATH" >&2
      exit 1
    fi
  done
  echo "setup.sh: nvcc not found. Install the CUDA Toolkit (12.x or 13.x):" \
       "https://developer.nvidia.com/cuda-downloads, then put its bin/ on PATH." >&2
  exit 1
fi
