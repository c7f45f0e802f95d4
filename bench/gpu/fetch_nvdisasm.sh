#!/usr/bin/env bash
# bench/gpu/fetch_nvdisasm.sh DIR — puts an nvdisasm at DIR/nvdisasm, for bench_cuda_static's
# instruction mix on machines whose CUDA install has no disassembler (the one these machines
# have: nvcc, ptxas, nvlink and fatbinary only). It takes the nvidia-cuda-toolkit of Debian's
# own archive (its non-free component, which these machines reach) and extracts nvdisasm from
# the package without installing it: Debian 13's (CUDA 12.4) first, which decodes every sm_90
# instruction CUDA 13's ptxas emits; else Debian 12's (CUDA 11.8), which silently leaves out
# the ones it does not know (VIADD, about 1 % of a 16-bit forward kernel, mostly outside its
# loop; sass_mix.py counts such gaps as instructions and says so).
# Then: BATON_NVDISASM=DIR/nvdisasm cmake --preset bench (or put it on PATH) and rebuild
# bench_cuda_static.
set -euo pipefail
dir=${1:?usage: fetch_nvdisasm.sh DIR}
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
mkdir -p "$dir"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
file=
for dist in trixie bookworm; do
  curl -fsS "$mirror/dists/$dist/non-free/binary-amd64/Packages.xz" | xz -d > "$work/Packages" || continue
  file=$(awk '/^Package: nvidia-cuda-toolkit$/ {found = 1} found && /^Filename:/ {print $2; exit}' "$work/Packages")
  [ -z "$file" ] || break
done
[ -n "$file" ] || { echo "fetch_nvdisasm.sh: no nvidia-cuda-toolkit in $mirror trixie or bookworm non-free" >&2; exit 1; }
echo "fetch_nvdisasm.sh: $mirror/$file"
curl -fsS -o "$work/toolkit.deb" "$mirror/$file"
dpkg-deb --fsys-tarfile "$work/toolkit.deb" | tar -x -C "$work" ./usr/bin/nvdisasm
install -m 755 "$work/usr/bin/nvdisasm" "$dir/nvdisasm"
"$dir/nvdisasm" --version | tail -1
