#!/usr/bin/env bash
# bench/gpu/fetch_nvdisasm.sh DIR — puts an nvdisasm at DIR/nvdisasm, for bench_cuda_static's
# instruction mix on machines whose CUDA install has no disassembler (the one these machines
# have: nvcc, ptxas, nvlink and fatbinary only). It takes Debian 12's nvidia-cuda-toolkit
# (CUDA 11.8, the non-free component of Debian's own archive, which these machines reach)
# and extracts nvdisasm from the package without installing it; CUDA 11.8 decodes sm_90.
# Then: BATON_NVDISASM=DIR/nvdisasm cmake --preset bench (or put it on PATH) and rebuild
# bench_cuda_static.
set -euo pipefail
dir=${1:?usage: fetch_nvdisasm.sh DIR}
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
mkdir -p "$dir"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
curl -fsS "$mirror/dists/bookworm/non-free/binary-amd64/Packages.xz" | xz -d > "$work/Packages"
file=$(awk '/^Package: nvidia-cuda-toolkit$/ {found = 1} found && /^Filename:/ {print $2; exit}' "$work/Packages")
[ -n "$file" ] || { echo "fetch_nvdisasm.sh: no nvidia-cuda-toolkit in $mirror bookworm non-free" >&2; exit 1; }
echo "fetch_nvdisasm.sh: $mirror/$file"
curl -fsS -o "$work/toolkit.deb" "$mirror/$file"
dpkg-deb --fsys-tarfile "$work/toolkit.deb" | tar -x -C "$work" ./usr/bin/nvdisasm
install -m 755 "$work/usr/bin/nvdisasm" "$dir/nvdisasm"
"$dir/nvdisasm" --version | tail -1
