#!/usr/bin/env bash
# bench/gpu/compile_static.sh NVCC INCLUDE_DIR SOURCE OUT_DIR ARCH — compiles SOURCE for sm_ARCH
# to a cubin and keeps ptxas's statistics (OUT_DIR/ptxas_smARCH.txt: registers, spills, stack,
# static shared memory per kernel), which bench_cuda_static reads; bench/gpu/CMakeLists.txt
# runs this.
set -euo pipefail
nvcc=$1 include=$2 source=$3 out=$4 arch=$5
mkdir -p "$out"
flags=(-std=c++20 --expt-relaxed-constexpr "-arch=sm_$arch" "-I$include")
"$nvcc" "${flags[@]}" -cubin -Xptxas -v -o "$out/kernels_sm$arch.cubin" "$source" 2> "$out/ptxas_sm$arch.txt.tmp"
mv "$out/ptxas_sm$arch.txt.tmp" "$out/ptxas_sm$arch.txt"
