#!/usr/bin/env bash
# bench/gpu/run.sh — the GPU proof of baton in one command (issue 16), from the repository root:
#
#   bench/gpu/run.sh            # on a machine with /usr/local/cuda and a visible NVIDIA GPU
#   bench/gpu/run.sh --cpu      # (or --dry-run) the same configure/build/run without a GPU:
#                               # the GPU tests and benchmarks report themselves skipped
#   bench/gpu/run.sh --pack-deps  # here, before sending the tree to a GPU machine without
#                               # Debian's Catch2: copies it into .gpu-deps/ (git-ignored;
#                               # carry it), which a later run uses when present
#
# It configures a fresh build directory with CUDA (Release, the GPU's architecture from
# nvidia-smi; 90 in --cpu mode), builds only the programs of the ctest entries labelled `gpu`
# and of the GPU benchmarks (bench/gpu), runs `ctest -L '^gpu$'`, prints passed / failed /
# skipped (on a GPU machine a skip is a failure of this script: it means the GPU was not
# used), runs the benchmarks and prints every `NAME: value` line they print, with
# `nvidia-smi -L` and the date. Exit status 0 only if everything passed.
#
# Options: --build-dir DIR (default build/gpu-run; removed and configured afresh),
#          --jobs N (default 16), --keep (reuse DIR instead of starting afresh).
# Needs no network: only cmake, ninja, g++ and Catch2 (Debian packages, see
# scripts/install-deps.sh, which this script does not call: the GPU machine is offline; or
# Catch2 from .gpu-deps/, see --pack-deps) and CUDA under /usr/local/cuda, with NCCL there or
# in the nvidia-nccl Python wheel. Kokkos, MPI and BLAS are used when present.
set -uo pipefail

mode=gpu
build_dir=build/gpu-run
jobs=16
fresh=1
while [ $# -gt 0 ]; do
  case "$1" in
    --cpu | --dry-run) mode=cpu ;;
    --build-dir) build_dir="$2"; shift ;;
    --build-dir=*) build_dir="${1#*=}" ;;
    --jobs) jobs="$2"; shift ;;
    --jobs=*) jobs="${1#*=}" ;;
    --keep) fresh=0 ;;
    --pack-deps) mode=pack ;;
    -h | --help) sed -n '2,26p' "$0"; exit 0 ;;
    *) echo "run.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done

started=$(date +%s)
say() { printf '\n=== %s (%ds)\n' "$*" "$(( $(date +%s) - started ))"; }
die() { echo "run.sh: $*" >&2; exit 1; }

[ -f CMakeLists.txt ] && [ -d include/baton ] || die "run it from the repository root (bench/gpu/run.sh)"

if [ "$mode" = pack ]; then
  # Debian's Catch2 2 (headers, CMake package, the static main its targets file names), laid
  # out as an install prefix so its relocatable CMake files find themselves.
  command -v dpkg >/dev/null && dpkg -s catch2 >/dev/null 2>&1 || die "--pack-deps needs Debian's catch2 package here"
  rm -rf .gpu-deps
  dpkg -L catch2 | grep -E '^/usr/(include|lib)/' | while read -r path; do
    if [ -f "$path" ]; then
      mkdir -p ".gpu-deps/$(dirname "${path#/usr/}")" && cp "$path" ".gpu-deps/${path#/usr/}"
    fi
  done
  [ -f .gpu-deps/lib/cmake/Catch2/Catch2Config.cmake ] || die "--pack-deps: Catch2's CMake package was not copied"
  echo "run.sh: Catch2 copied into .gpu-deps/ ($(du -sh .gpu-deps | cut -f1)); carry .gpu-deps with the tree"
  exit 0
fi

say "machine"
date -u '+date: %Y-%m-%dT%H:%M:%SZ'
echo "mode: $mode"
for tool in cmake ninja g++; do
  command -v "$tool" >/dev/null || die "$tool is missing: scripts/install-deps.sh lists the Debian packages (apt-get install cmake ninja-build g++ catch2)"
done
[ -x /usr/local/cuda/bin/nvcc ] || die "/usr/local/cuda/bin/nvcc is missing: install the CUDA toolkit (with NCCL) under /usr/local/cuda"
/usr/local/cuda/bin/nvcc --version | tail -n 2
arch=90
if [ "$mode" = gpu ]; then
  command -v nvidia-smi >/dev/null || die "nvidia-smi is missing: no NVIDIA driver here (use --cpu to test this script without a GPU)"
  nvidia-smi -L || die "nvidia-smi -L failed: no GPU visible (use --cpu to test this script without a GPU)"
  cap=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n 1 | tr -d ' .')
  case "$cap" in
    [0-9][0-9] | [0-9][0-9][0-9]) arch=$cap ;;
    *) echo "run.sh: could not read the compute capability (got '$cap'); building for sm_90" ;;
  esac
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
else
  echo "no GPU used: the GPU tests and benchmarks are built and run, and report themselves skipped"
fi
echo "CUDA architecture: $arch"

extra=()
if [ -d .gpu-deps ]; then extra+=("-DCMAKE_PREFIX_PATH=$PWD/.gpu-deps"); echo "using .gpu-deps/ (Catch2)"; fi
if [ ! -f /usr/local/cuda/include/nccl.h ] && [ -z "${NCCL_ROOT:-}" ]; then
  # The nvidia-nccl wheel of a Python environment (include/nccl.h, lib/libnccl.so.2).
  wheel=$(python3 -c 'import nvidia.nccl as n; print(list(n.__path__)[0])' 2>/dev/null || true)
  if [ -n "$wheel" ] && [ -f "$wheel/include/nccl.h" ]; then extra+=("-DNCCL_ROOT=$wheel"); echo "NCCL from $wheel"; fi
fi

say "configure $build_dir"
if [ "$fresh" = 1 ]; then rm -rf "$build_dir"; fi
mkdir -p "$build_dir/run-logs" || die "cannot create $build_dir"
logs="$build_dir/run-logs"
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBATON_WITH_TORCH=OFF -DBATON_BUILD_BENCH=ON \
  -DBATON_BUILD_EXAMPLES=OFF -DBATON_TEST_INSTALL=OFF -DBATON_CUDA_ARCHITECTURES="$arch" \
  -DCMAKE_CUDA_ARCHITECTURES="$arch" "${extra[@]}" > "$logs/configure.log" 2>&1 ||
  { tail -n 40 "$logs/configure.log"; die "configure failed (log: $logs/configure.log)"; }
grep -E '^-- baton' "$logs/configure.log"
grep -q 'baton: NCCL .* found' "$logs/configure.log" || echo "run.sh: warning: NCCL not found: the NCCL tests and benchmarks are not built"

# The programs of the gpu tests and of the GPU benchmarks (ctest entries in bench/gpu), from
# ctest's own listing, so that a test added later is picked up without editing this script.
abs_build=$(cd "$build_dir" && pwd)
# (ctest -N -V names a program as "Test command: PATH ARGS" once built, and as "Could not find
# executable PATH" before.)
listing() {
  (cd "$build_dir" && ctest -N -V "$@" 2>&1 |
    sed -n -e 's/^[0-9]*: Test command: \([^ ]\{1,\}\).*/\1/p' -e 's/^Could not find executable \([^ ]\{1,\}\)$/\1/p')
}
test_programs=$(listing -L '^gpu$' | sort -u)
bench_programs=$(listing -L '^gpu-bench$' | sort -u)
targets=$(printf '%s\n%s\n' "$test_programs" "$bench_programs" | sed '/^$/d' | xargs -r -n 1 basename | sort -u)
[ -n "$targets" ] || die "no test labelled gpu and no GPU benchmark is registered (is nvcc found? see $logs/configure.log)"
echo "targets:" $targets

say "build (ninja -j$jobs)"
# -k 0: a program that does not compile must not keep the others from running; its tests
# then show as Not Run (failed) and the script fails at the end.
status=0
# shellcheck disable=SC2086
if ! ninja -C "$build_dir" -j "$jobs" -k 0 $targets; then
  echo "run.sh: the build failed (see the errors above); running what was built"
  status=1
fi

say "tests (ctest -L '^gpu\$')"
(cd "$build_dir" && ctest -L '^gpu$' --output-on-failure --timeout 300) | tee "$logs/tests.log"
passed=$(grep -cE 'Test +#[0-9]+: .* Passed' "$logs/tests.log")
failed=$(grep -cE 'Test +#[0-9]+: .*\*\*\*(Failed|Timeout|Exception)|Test +#[0-9]+: .*(Not Run|SEGFAULT|Subprocess aborted|Child aborted)' "$logs/tests.log")
skipped=$(grep -cE 'Test +#[0-9]+: .*Skipped' "$logs/tests.log")
echo "gpu tests: passed $passed, failed $failed, skipped $skipped"
if [ "$failed" -gt 0 ]; then status=1; fi
if [ "$mode" = gpu ] && [ "$skipped" -gt 0 ]; then
  echo "run.sh: $skipped gpu test(s) skipped on a GPU machine: they did not use the GPU (see their SKIPPED reason above)"
  status=1
fi
if [ "$((passed + failed + skipped))" -eq 0 ]; then echo "run.sh: no gpu test ran"; status=1; fi

say "benchmarks"
bench_status=0
for program in $bench_programs; do
  name=$(basename "$program")
  echo "--- $name"
  (cd "$build_dir" && ctest -R "^${name}\$" -V --timeout 300) > "$logs/$name.log" 2>&1
  rc=$?
  if [ ! -x "$program" ]; then
    echo "$name was not built"
    bench_status=1
    continue
  fi
  # The program's own lines (ctest -V prefixes them with the test number).
  sed -n 's/^[0-9]*: //p' "$logs/$name.log" | grep -E '^[A-Za-z][A-Za-z0-9_.]*: ' |
    grep -vE '^(Test command|Working Directory|Environment variables|Test timeout|SKIPPED): '
  if grep -q 'SKIPPED:' "$logs/$name.log"; then
    sed -n 's/^[0-9]*: //p' "$logs/$name.log" | grep -m 1 '^SKIPPED:'
    [ "$mode" = gpu ] && bench_status=1
  elif [ $rc -ne 0 ]; then
    tail -n 20 "$logs/$name.log"
    bench_status=1
  fi
done
[ -n "$bench_programs" ] || echo "(no GPU benchmark registered)"
if [ $bench_status -ne 0 ]; then echo "run.sh: a benchmark failed or skipped (logs: $logs/<name>.log)"; status=1; fi

say "done"
[ "$mode" = gpu ] && nvidia-smi -L
date -u '+date: %Y-%m-%dT%H:%M:%SZ'
echo "elapsed: $(( $(date +%s) - started )) s"
if [ $status -eq 0 ]; then echo "run.sh: OK"; else echo "run.sh: FAILED"; fi
exit $status
