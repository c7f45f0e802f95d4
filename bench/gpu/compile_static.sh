#!/usr/bin/env bash
# bench/gpu/compile_static.sh NVCC INCLUDE_DIR SOURCE OUT_DIR ARCH [NVDISASM] — compiles SOURCE
# for sm_ARCH to a cubin and keeps ptxas's statistics (OUT_DIR/ptxas_smARCH.txt: registers,
# spills, stack, static shared memory per kernel) and, with a disassembler, each kernel's
# main-loop instruction mix (OUT_DIR/sass_mix_smARCH.txt, bench/gpu/sass_mix.py), which
# bench_cuda_static reads; bench/gpu/CMakeLists.txt runs this. The disassembler: NVDISASM if
# given, else the CUDA install's, else one on PATH; without one the mix file says why.
set -euo pipefail
nvcc=$1 include=$2 source=$3 out=$4 arch=$5 nvdisasm=${6:-}
mkdir -p "$out"
flags=(-std=c++20 --expt-relaxed-constexpr "-arch=sm_$arch" "-I$include")
"$nvcc" "${flags[@]}" -cubin -Xptxas -v -o "$out/kernels_sm$arch.cubin" "$source" 2> "$out/ptxas_sm$arch.txt.tmp"
mv "$out/ptxas_sm$arch.txt.tmp" "$out/ptxas_sm$arch.txt"

mix="$out/sass_mix_sm$arch.txt"
[ -n "$nvdisasm" ] || nvdisasm=$(dirname "$nvcc")/nvdisasm
[ -x "$nvdisasm" ] || nvdisasm=$(command -v nvdisasm || true)
if [ -z "$nvdisasm" ]; then
  echo "# unavailable: no nvdisasm (bench/gpu/fetch_nvdisasm.sh DIR fetches one; then BATON_NVDISASM=DIR/nvdisasm)" > "$mix"
elif ! command -v python3 > /dev/null; then
  echo "# unavailable: no python3 for bench/gpu/sass_mix.py" > "$mix"
else
  python3 "$(dirname "$0")/sass_mix.py" "$nvdisasm" "$out/kernels_sm$arch.cubin" "$mix"
fi
