#!/usr/bin/env bash
# Installs the Debian packages weft's build, tests and benchmarks need, skipping those already
# present. The CUDA 13 toolkit (nvcc, CCCL, NCCL) is expected in its usual place; this script
# does not install it. Runs as root (or with sudo available); downloads nothing else.
set -euo pipefail

packages=(
  cmake ninja-build g++ clang clang-format
  doctest-dev librange-v3-dev
  libopenmpi-dev openmpi-bin
  libopenblas-dev libbenchmark-dev
  libomp-dev  # OpenMP for clang++ (the asan preset)
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if ((${#missing[@]})); then
  echo "weft: installing missing Debian packages: ${missing[*]}"
  sudo_cmd=()
  if [[ $(id -u) -ne 0 ]]; then sudo_cmd=(sudo); fi
  "${sudo_cmd[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
else
  echo "weft: all Debian dependencies present"
fi

# nvcc is needed only for the cuda preset, but CCCL (cuda::std::mdspan) is needed by every build.
cuda_root=""
for c in "${CUDA_PATH:-}" "${CUDA_HOME:-}" "$(dirname "$(dirname "$(command -v nvcc 2>/dev/null || echo /x/x)")")" /usr/local/cuda; do
  if [[ -n "$c" && -d "$c/include/cccl" ]]; then cuda_root="$c"; break; fi
done
if [[ -z "$cuda_root" ]]; then
  echo "weft: the CUDA toolkit (for CCCL's cuda::std::mdspan) was not found; install CUDA 13 or set CUDA_PATH" >&2
  exit 1
fi
