#!/usr/bin/env bash
# Installs the Debian packages baton's build, tests and benchmarks need (the table in
# docs/building.md). Idempotent: does nothing when everything is present. When not root,
# prints the exact command to run instead of failing halfway.
set -euo pipefail

packages=(
  g++ cmake ninja-build     # toolchain
  catch2                    # tests (Catch2 2.13)
  libcli11-dev              # CLI11 2.1 (header-only): the command lines of baton-train and baton-schedule
  libtrilinos-kokkos-dev    # Kokkos 3.4 (Serial) for the attention kernels
  libopenmpi-dev openmpi-bin  # MPI communicator and its tests
  libopenblas-dev           # the sgemm roof of bench_attention
  nlohmann-json3-dev        # checkpoints (baton::json): safetensors headers and manifests
  clang libclang-rt-14-dev  # libFuzzer: the CSV schedule fuzz target (tests/fuzz)
  libtorch-dev              # LibTorch 1.13 (CPU): the LibTorch adapter, baton::torch
)

missing=()
for pkg in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$pkg")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
  echo "install-deps: missing packages: ${missing[*]}" >&2
  echo "install-deps: run as root:  apt-get update && apt-get install -y ${missing[*]}" >&2
  exit 1
fi

echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}"
