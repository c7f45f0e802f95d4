#!/usr/bin/env bash
# bench/gpu/run.sh — the GPU proof of baton in one command, from the repository root:
#
#   bench/gpu/run.sh              # on a machine with /usr/local/cuda and a visible NVIDIA GPU
#   bench/gpu/run.sh --no-gpu     # (or --cpu) the same parts without a GPU: the GPU programs
#                                 # report themselves skipped, which is not a failure here
#   bench/gpu/run.sh --self-test  # the script's own logic (parts, limits, summary) on fake
#                                 # parts, in seconds, without nvcc: CI runs this
#   bench/gpu/run.sh --pack-deps  # here, before sending the tree to a GPU machine without
#                                 # Debian's Catch2: copies it into .gpu-deps/ (git-ignored;
#                                 # carry it), which a later run uses when present
#
# A lease on a GPU machine is short and a call on it is limited (10 minutes), so the figures
# come first and nothing can use up the whole call:
#   configure -> build the GPU benchmarks -> run each benchmark -> the PyTorch anchor ->
#   build the GPU tests -> run them -> a profile -> summary.
# The profile is Nsight Compute (ncu) on the first forward and backward launches of
# bench_cuda_attention --quick, its report in DIR/run-logs/ncu.txt and a digest in the log;
# skipped, with the reason, where there is no GPU, no ncu, or ncu cannot read the counters.
# Every part runs under its own time limit (LIMITS below; together 470 s, so the script ends
# within 8 minutes of a 10-minute call), and never past the run's deadline (--budget, 480 s).
# A part that fails or times out is recorded and the next one runs. Every line is printed as
# it comes and also written to one log, DIR/run-logs/run.log. Without Catch2 (and no
# .gpu-deps/) the benchmarks are still built and run; the tests are reported as not built.
#
# The anchor: PyTorch's scaled_dot_product_attention (flash and cuDNN backends, bf16) on the
# shapes of bench_cuda_attention, forward and forward+backward, causal and full, timed on the
# same GPU (bench/gpu/torch_sdpa.py); the summary prints baton ÷ torch for each (> 1: baton is
# faster). Skipped, with the reason, where Python has no torch with CUDA.
#
# The summary ends with one line per part (status, seconds, limit) and `run.sh: OK` or
# `run.sh: FAILED`; exit status 0 only if every part passed (on a GPU machine a GPU test that
# skips counts as failed, unless its reason is that it needs two GPUs and there is one).
#
# Options: --build-dir DIR (default build/gpu-run; removed and configured afresh),
#          --jobs N (default: the CPU count), --keep (reuse DIR), --budget S (default 480),
#          --quick (the benchmarks' small shapes), --scale K (every part's limit times K, for a
#          machine slower than a GPU host: a --no-gpu run on 2 cores needs about 8).
# Needs no network: cmake, ninja, g++ (and Catch2 for the tests; Debian packages, see
# scripts/install-deps.sh, which this script does not call: the GPU machine is offline) and
# CUDA under /usr/local/cuda, with NCCL there or in the nvidia-nccl Python wheel.
set -uo pipefail

# Seconds per part. Builds use every core; the benchmarks' own repetitions fit theirs.
# (Measured on an H200 host, 16 cores: 7-9, 46-52, 7-9, 4, 19-22, 46-53, 28-37 s.)
declare -A LIMITS=(
  [configure]=45 [build_benchmarks]=110 [bench_cuda_attention]=60 [bench_cp_nccl]=40
  [torch_anchor]=50 [build_tests]=70 [tests]=50 [profile]=45
)
budget=480

mode=gpu
build_dir=build/gpu-run
jobs=$(nproc 2>/dev/null || echo 8)
fresh=1
quick=0
scale=1
while [ $# -gt 0 ]; do
  case "$1" in
    --no-gpu | --cpu | --dry-run) mode=cpu ;;
    --self-test) mode=self-test ;;
    --build-dir) build_dir="$2"; shift ;;
    --build-dir=*) build_dir="${1#*=}" ;;
    --jobs) jobs="$2"; shift ;;
    --jobs=*) jobs="${1#*=}" ;;
    --budget) budget="$2"; shift ;;
    --budget=*) budget="${1#*=}" ;;
    --scale) scale="$2"; shift ;;
    --scale=*) scale="${1#*=}" ;;
    --keep) fresh=0 ;;
    --quick) quick=1 ;;
    --pack-deps) mode=pack ;;
    -h | --help) sed -n '2,/^set -uo pipefail/p' "$0" | sed '$d'; exit 0 ;;
    *) echo "run.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done
case "$budget" in '' | *[!0-9]*) echo "run.sh: --budget takes whole seconds, got '$budget'" >&2; exit 2 ;; esac
case "$scale" in '' | *[!0-9]*) echo "run.sh: --scale takes a whole number, got '$scale'" >&2; exit 2 ;; esac

started=$(date +%s)
deadline=$((started + budget))
reserve=5  # seconds kept for the summary
say() { printf '\n=== %s (%ds)\n' "$*" "$(( $(date +%s) - started ))"; }
die() { echo "run.sh: $*" >&2; exit 1; }

# ---- parts ---------------------------------------------------------------------------------
# run_part NAME COMMAND...: runs COMMAND (a shell function or program) under the part's limit,
# cut to the time left before the deadline; its output streams to the terminal and the log.
# Records "NAME STATUS SECONDS LIMIT [NOTE]" in part_lines; STATUS is ok, failed(rc), timeout
# or skipped. A command may write one line of note into $part_note_file and ask to be
# recorded as skipped by exiting 77.
part_lines=()
overall=0
part_note_file=$(mktemp)
trap 'rm -f "$part_note_file"' EXIT
run_part() {
  local name=$1; shift
  local limit=$(( ${LIMITS[$name]:-60} * scale ))
  local left=$((deadline - reserve - $(date +%s)))
  : > "$part_note_file"
  if [ "$left" -le 0 ]; then
    part_lines+=("$name skipped 0 $limit no time left before the deadline (--budget $budget)")
    overall=1
    say "$name: skipped (no time left)"
    return 0
  fi
  [ "$left" -lt "$limit" ] && limit=$left
  say "$name (limit ${limit}s)"
  local t0 rc status pid timed_out=0
  t0=$(date +%s)
  # The part runs as its own process group (job control), so that a timeout stops what it
  # started too (ninja's compilers, ctest's tests), not only the shell running it.
  set -m
  ( "$@" ) &
  pid=$!
  set +m
  while kill -0 "$pid" 2>/dev/null; do
    if [ $(( $(date +%s) - t0 )) -ge "$limit" ]; then
      timed_out=1
      kill -TERM -- "-$pid" 2>/dev/null
      for _ in 1 2 3 4 5 6 7 8 9 10; do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
      kill -KILL -- "-$pid" 2>/dev/null
      break
    fi
    sleep 0.2
  done
  wait "$pid" 2>/dev/null
  rc=$?
  [ $timed_out = 1 ] && rc=124
  local seconds=$(( $(date +%s) - t0 ))
  case $rc in
    0) status=ok ;;
    77) status=skipped ;;
    124 | 137) status=timeout; overall=1 ;;
    *) status="failed($rc)"; overall=1 ;;
  esac
  part_lines+=("$name $status $seconds $limit $(head -c 300 "$part_note_file" | tr '\n' ' ')")
  echo "--- $name: $status in ${seconds}s"
  return 0
}

# The figures the run printed, as NAME VALUE (the median of `NAME: median (min, max, n)`).
figure() { sed -n "s/^$1: \([-0-9.eE+]*\).*/\1/p" "$log" | tail -n 1; }

summary() {
  say "summary"
  # baton ÷ torch: time ratios (torch's milliseconds ÷ baton's), > 1 when baton is faster.
  local any_ratio=0
  for tag in $(sed -n 's/^torch_\(flash\|cudnn\)_fwd_ms_\([A-Za-z0-9_]*\): .*/\2/p' "$log" | sort -u); do
    for backend in flash cudnn; do
      local tf tb bf bb
      tf=$(figure "torch_${backend}_fwd_ms_$tag"); tb=$(figure "torch_${backend}_fwdbwd_ms_$tag")
      bf=$(figure "cuda_fwd_ms_$tag"); bb=$(figure "cuda_bwd_ms_$tag")
      if [ -n "$tf" ] && [ -n "$bf" ]; then
        awk -v t="$tf" -v b="$bf" -v n="baton_vs_torch_${backend}_fwd_$tag" 'BEGIN { if (b > 0) printf "%s: %.3f\n", n, t / b }'
        any_ratio=1
      fi
      if [ -n "$tb" ] && [ -n "$bf" ] && [ -n "$bb" ]; then
        awk -v t="$tb" -v f="$bf" -v b="$bb" -v n="baton_vs_torch_${backend}_fwdbwd_$tag" \
          'BEGIN { if (f + b > 0) printf "%s: %.3f\n", n, t / (f + b) }'
      fi
    done
  done
  [ "$any_ratio" = 1 ] || echo "(no baton ÷ torch ratio: the anchor or baton's figures are missing)"
  printf '%-22s %-12s %8s %8s  %s\n' part status seconds limit note
  local line
  for line in "${part_lines[@]}"; do
    # shellcheck disable=SC2086
    set -- $line
    local name=$1 status=$2 seconds=$3 limit=$4
    shift 4
    printf '%-22s %-12s %8s %8s  %s\n' "$name" "$status" "$seconds" "$limit" "$*"
  done
  echo "figures: $(grep -cE '^[A-Za-z][A-Za-z0-9_.]*: [-0-9.]' "$log")"
  echo "elapsed: $(( $(date +%s) - started )) s of a budget of $budget s"
  if [ $overall -eq 0 ]; then echo "run.sh: OK"; else echo "run.sh: FAILED"; fi
}

# skip_reasons TESTS_LOG LAST_TEST_LOG: "TEST: REASON" for each test that ctest's summary
# (TESTS_LOG) reports as Skipped, REASON being the first line of its output that says why
# (a test prints `SKIPPED: <case>: <reason>`). ctest prints no output of a skipped test, even
# with --output-on-failure; its Testing/Temporary/LastTest.log (LAST_TEST_LOG) keeps it.
skip_reasons() {
  awk 'FNR == NR {
         if ($0 ~ /Test +#[0-9]+: .*Skipped/) { name = $0; sub(/.*Test +#[0-9]+: /, "", name); sub(/ .*/, "", name); skipped[name] = 1 }
         next
       }
       /^[0-9]+\/[0-9]+ Test: / { test = $0; sub(/^[0-9]+\/[0-9]+ Test: /, "", test); next }
       /SKIPPED:/ && (test in skipped) && !(test in told) { line = $0; sub(/.*SKIPPED: /, "", line); print test ": " line; told[test] = 1 }
       END { for (t in skipped) if (!(t in told)) print t ": (no SKIPPED line in its output)" }' "$1" "$2" 2>/dev/null
}
# A skip that one GPU should give: an NCCL case that needs a ring of 2 (tests/cp/test_cp_nccl_gpu.cu).
two_gpu_reason='one CUDA device: NCCL takes one rank per GPU'

# Nsight Compute on the first forward and backward kernels (3 launches: the forward and the
# backward's two passes), with the sections that say where a kernel waits.
profile() {
  [ "$mode" = gpu ] || { echo "no GPU" > "$part_note_file"; return 77; }
  local ncu
  ncu=$(command -v ncu || true)
  [ -n "$ncu" ] || ncu=$(ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -n 1)
  [ -n "$ncu" ] || { echo "no ncu (Nsight Compute) here" > "$part_note_file"; return 77; }
  local program
  program=$(programs_labelled '^gpu-bench$' | grep '/bench_cuda_attention$' | head -n 1)
  [ -x "$program" ] || { echo "bench_cuda_attention was not built" > "$part_note_file"; return 1; }
  "$ncu" --clock-control none -k 'regex:forward_kernel|backward_tile_kernel' -c 3 \
    --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
    --section SchedulerStats --section ComputeWorkloadAnalysis --section InstructionStats \
    "$program" --quick --reps 1 > "$logs/ncu.txt" 2>&1
  local rc=$?
  if ! grep -q 'Registers Per Thread' "$logs/ncu.txt"; then
    # A runtime that hides the counters (gVisor) is the machine's limit, not baton's.
    echo "ncu could not profile (rc $rc): $(grep -m 1 -E 'ERR|Error|error' "$logs/ncu.txt" | head -c 200)" > "$part_note_file"
    return 77
  fi
  echo "report: $logs/ncu.txt; digest:"
  grep -E '^  [a-z_]+.*\(.*\)x\(|Duration|Registers Per Thread|Dynamic Shared Memory Per Block|Achieved Occupancy|Executed Ipc Active|Warp Cycles Per Issued Instruction|Eligible Warps Per Scheduler|Issue Slots Busy|highest-utilized' \
    "$logs/ncu.txt" | sed -e 's/  */ /g' -e 's/^ //' | cut -c 1-160
}

# ---- the self-test: the machinery above on fake parts ----------------------------------------
if [ "$mode" = self-test ]; then
  scratch=$(mktemp -d)
  logs=$scratch
  log=$scratch/run.log
  fake_bench() { echo "cuda_fwd_ms_S64_D128_bf16: 2.000 (min 1.9, max 2.1, n 5)"; echo "cuda_bwd_ms_S64_D128_bf16: 6"; }
  fake_torch() { echo "torch_flash_fwd_ms_S64_D128_bf16: 3.000 (min 3, max 3, n 5)"; echo "torch_flash_fwdbwd_ms_S64_D128_bf16: 12"; }
  fake_hang() { echo "started"; sleep 30; echo "never printed"; }
  fake_fail() { echo "boom"; return 3; }
  fake_skip() { echo "no torch here" > "$part_note_file"; return 77; }
  LIMITS=([fake_bench]=5 [fake_torch]=5 [fake_hang]=1 [fake_fail]=5 [fake_skip]=5 [late]=5)
  {
    run_part fake_bench fake_bench
    run_part fake_torch fake_torch
    run_part fake_hang fake_hang
    run_part fake_fail fake_fail
    run_part fake_skip fake_skip
    deadline=$(date +%s)  # the budget is spent: the next part must not run
    run_part late fake_bench
    summary
  } > "$log" 2>&1
  problems=()
  expect() { grep -qE "$1" "$log" || problems+=("missing: $1"); }
  refuse() { ! grep -qE "$1" "$log" || problems+=("unexpected: $1"); }
  expect '^fake_bench +ok '
  expect '^fake_torch +ok '
  expect '^fake_hang +timeout +[12] +1 '
  expect '^fake_fail +failed\(3\) '
  expect '^fake_skip +skipped .*no torch here'
  expect '^late +skipped +0 .*no time left'
  expect '^baton_vs_torch_flash_fwd_S64_D128_bf16: 1\.500$'
  expect '^baton_vs_torch_flash_fwdbwd_S64_D128_bf16: 1\.500$'
  expect '^run\.sh: FAILED$'
  refuse 'never printed'
  # The real limits fit the budget, with the summary's reserve.
  declare -A REAL=([configure]=45 [build_benchmarks]=110 [bench_cuda_attention]=60 [bench_cp_nccl]=40
                   [torch_anchor]=50 [build_tests]=70 [tests]=50 [profile]=45)
  total=0
  for k in "${!REAL[@]}"; do total=$((total + REAL[$k])); done
  [ $((total + reserve)) -le 480 ] || problems+=("the parts' limits add up to $total s: over the 480 s budget")
  # The real table is the one the script uses (kept in sync by hand: compare).
  real_line=$(sed -n '/^declare -A LIMITS=(/,/^)/p' "$0" | tr -s ' \n' ' ')
  for k in "${!REAL[@]}"; do
    case "$real_line" in *"[$k]=${REAL[$k]}"*) ;; *) problems+=("LIMITS[$k] differs from the self-test's copy") ;; esac
  done
  # Skips and their reasons, from a ctest summary and a LastTest.log shaped as ctest writes them.
  cat > "$scratch/tests.log" <<'LOG'
 5/29 Test  #25: test_cp_nccl_gpu.cp_cuda_gpu_nccl ...........................***Skipped   0.14 sec
 6/29 Test  #26: test_cp_nccl_gpu.cp_cuda_gpu_cuda_attention .................   Passed    3.30 sec
 7/29 Test  #27: test_cuda_gpu.cuda_gpu_reuse ................................***Skipped   0.15 sec
 8/29 Test  #28: test_cuda_gpu.cuda_gpu_quiet ................................***Skipped   0.15 sec
LOG
  cat > "$scratch/LastTest.log" <<'LOG'
5/29 Test: test_cp_nccl_gpu.cp_cuda_gpu_nccl
Output:
SKIPPED: ring over NCCL: one CUDA device: NCCL takes one rank per GPU and a ring of 1 moves no K/V block
6/29 Test: test_cp_nccl_gpu.cp_cuda_gpu_cuda_attention
Output:
SKIPPED: one section only: one CUDA device: NCCL takes one rank per GPU (a passed test is not counted)
7/29 Test: test_cuda_gpu.cuda_gpu_reuse
Output:
SKIPPED: reuse: no CUDA device
SKIPPED: reuse again: one CUDA device: NCCL takes one rank per GPU (only the first reason counts)
LOG
  skip_reasons "$scratch/tests.log" "$scratch/LastTest.log" > "$scratch/skips.log"
  [ "$(grep -cF "$two_gpu_reason" "$scratch/skips.log")" = 1 ] || problems+=("skip_reasons: not one two-GPU skip")
  grep -qx 'test_cuda_gpu.cuda_gpu_reuse: reuse: no CUDA device' "$scratch/skips.log" || problems+=("skip_reasons: reuse's reason")
  grep -qx 'test_cuda_gpu.cuda_gpu_quiet: (no SKIPPED line in its output)' "$scratch/skips.log" ||
    problems+=("skip_reasons: a skip without a reason")
  [ "$(wc -l < "$scratch/skips.log")" = 3 ] || problems+=("skip_reasons: $(wc -l < "$scratch/skips.log") lines, want 3")
  # The profile: skipped without a GPU, and where ncu cannot read the counters (a fake ncu).
  mkdir -p "$scratch/bin"
  printf '#!/bin/sh\necho "==ERROR== Failed to initialize the profiler"\nexit 1\n' > "$scratch/bin/ncu"
  printf '#!/bin/sh\nexit 0\n' > "$scratch/bin/bench_cuda_attention"
  chmod +x "$scratch/bin/ncu" "$scratch/bin/bench_cuda_attention"
  programs_labelled() { echo "$scratch/bin/bench_cuda_attention"; }
  LIMITS[profile]=5
  deadline=$(( $(date +%s) + 60 ))
  {
    mode=cpu run_part profile profile
    PATH="$scratch/bin:$PATH" mode=gpu run_part profile_no_counters profile
  } > "$scratch/profile.log" 2>&1
  grep -qE '^profile +skipped .*no GPU' <(summary 2>/dev/null) || problems+=("profile: not skipped without a GPU")
  grep -qE '^profile_no_counters +skipped .*ncu could not profile' <(summary 2>/dev/null) ||
    problems+=("profile: an ncu that cannot profile is not a skip with its reason")
  if [ ${#problems[@]} -gt 0 ]; then
    cat "$scratch/skips.log"
    cat "$log"
    printf 'run.sh --self-test: FAILED: %s\n' "${problems[@]}"
    rm -rf "$scratch"
    exit 1
  fi
  echo "run.sh --self-test: OK (6 fake parts: ok, ok, timeout, failed, skipped, past the deadline; limits $total s + $reserve s <= 480 s; skip reasons; profile skips)"
  rm -rf "$scratch"
  exit 0
fi

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

if [ "$fresh" = 1 ]; then rm -rf "$build_dir"; fi
logs="$build_dir/run-logs"
mkdir -p "$logs" || die "cannot create $logs"
log="$logs/run.log"
: > "$log"
exec > >(tee -a "$log") 2>&1

say "machine"
date -u '+date: %Y-%m-%dT%H:%M:%SZ'
echo "mode: $mode"
for tool in cmake ninja g++ timeout; do
  command -v "$tool" >/dev/null || die "$tool is missing: scripts/install-deps.sh lists the Debian packages (apt-get install cmake ninja-build g++ catch2)"
done
[ -x /usr/local/cuda/bin/nvcc ] || die "/usr/local/cuda/bin/nvcc is missing: install the CUDA toolkit (with NCCL) under /usr/local/cuda"
/usr/local/cuda/bin/nvcc --version | tail -n 2
arch=90
gpus=0
if [ "$mode" = gpu ]; then
  command -v nvidia-smi >/dev/null || die "nvidia-smi is missing: no NVIDIA driver here (use --no-gpu to run this script without a GPU)"
  nvidia-smi -L || die "nvidia-smi -L failed: no GPU visible (use --no-gpu to run this script without a GPU)"
  gpus=$(nvidia-smi -L | grep -c '^GPU')
  cap=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n 1 | tr -d ' .')
  case "$cap" in
    [0-9][0-9] | [0-9][0-9][0-9]) arch=$cap ;;
    *) echo "run.sh: could not read the compute capability (got '$cap'); building for sm_90" ;;
  esac
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
else
  echo "no GPU used: the GPU tests and benchmarks are built and run, and report themselves skipped"
fi
echo "CUDA architecture: $arch; GPUs: $gpus; jobs: $jobs; budget: $budget s"

extra=()
if [ -d .gpu-deps ]; then extra+=("-DCMAKE_PREFIX_PATH=$PWD/.gpu-deps"); echo "using .gpu-deps/ (Catch2)"; fi
if [ ! -f /usr/local/cuda/include/nccl.h ] && [ -z "${NCCL_ROOT:-}" ]; then
  # The nvidia-nccl wheel of a Python environment (include/nccl.h, lib/libnccl.so.2).
  wheel=$(python3 -c 'import nvidia.nccl as n; print(list(n.__path__)[0])' 2>/dev/null || true)
  if [ -n "$wheel" ] && [ -f "$wheel/include/nccl.h" ]; then extra+=("-DNCCL_ROOT=$wheel"); echo "NCCL from $wheel"; fi
fi

# ---- the parts -------------------------------------------------------------------------------
configure() {
  local common=(-S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBATON_WITH_TORCH=OFF -DBATON_BUILD_BENCH=ON
                -DBATON_BUILD_EXAMPLES=OFF -DBATON_TEST_INSTALL=OFF -DBATON_CHECK_HEADERS=OFF
                -DBATON_CUDA_ARCHITECTURES="$arch" -DCMAKE_CUDA_ARCHITECTURES="$arch" "${extra[@]}")
  if cmake "${common[@]}" -DBATON_BUILD_TESTS=ON > "$logs/configure.log" 2>&1; then
    echo "tests: configured"
  elif grep -q Catch2 "$logs/configure.log"; then
    # No Catch2: the benchmarks need none.
    echo "Catch2 not found: configuring without the tests (bench/gpu/run.sh --pack-deps on a machine that has it)" |
      tee "$part_note_file"
    rm -rf "$build_dir/CMakeCache.txt" "$build_dir/CMakeFiles"
    cmake "${common[@]}" -DBATON_BUILD_TESTS=OFF > "$logs/configure.log" 2>&1 ||
      { tail -n 40 "$logs/configure.log"; return 1; }
  else
    tail -n 40 "$logs/configure.log"
    return 1
  fi
  grep -E '^-- baton' "$logs/configure.log"
  grep -q 'baton: NCCL .* found' "$logs/configure.log" ||
    echo "warning: NCCL not found: the NCCL tests and benchmarks are not built"
}

# The programs of the ctest entries with label $1, from ctest's own listing, so that a test
# added later is picked up without editing this script. (ctest -N -V names a program as "Test
# command: PATH ARGS" once built, and as "Could not find executable PATH" before.)
programs_labelled() {
  (cd "$build_dir" && ctest -N -V -L "$1" 2>&1 |
    sed -n -e 's/^[0-9]*: Test command: \([^ ]\{1,\}\).*/\1/p' -e 's/^Could not find executable \([^ ]\{1,\}\)$/\1/p') |
    sort -u
}

build_labelled() {
  local targets
  targets=$(programs_labelled "$1" | xargs -r -n 1 basename | sort -u)
  if [ -z "$targets" ]; then echo "nothing labelled $1 is registered" | tee "$part_note_file"; return 77; fi
  echo "targets:" $targets
  # -k 0: a program that does not compile must not keep the others from being built.
  # shellcheck disable=SC2086
  ninja -C "$build_dir" -j "$jobs" -k 0 $targets
}
build_benchmarks() { build_labelled '^gpu-bench$'; }
build_tests() {
  [ -f "$build_dir/tests/CTestTestfile.cmake" ] || { echo "not built: Catch2 missing" > "$part_note_file"; return 77; }
  build_labelled '^gpu$'
}

run_benchmark() {  # run_benchmark PROGRAM [ARGS...]: its lines as they come
  local program=$1; shift
  [ -x "$program" ] || { echo "$(basename "$program") was not built" | tee "$part_note_file"; return 1; }
  local out
  out=$(mktemp)
  "$program" "$@" | tee "$out"
  local rc=${PIPESTATUS[0]}
  if grep -q '^SKIPPED:' "$out"; then
    grep -m 1 '^SKIPPED:' "$out" > "$part_note_file"
    rm -f "$out"
    [ "$mode" = gpu ] && return 1  # a GPU machine that skips did not use its GPU
    return 77
  fi
  rm -f "$out"
  return "$rc"
}

torch_anchor() {
  if ! python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    echo "no PyTorch with CUDA in python3" > "$part_note_file"
    return 77
  fi
  local args=()
  [ "$quick" = 1 ] && args+=(--quick)
  python3 -u bench/gpu/torch_sdpa.py "${args[@]}"
}

run_tests() {
  [ -f "$build_dir/tests/CTestTestfile.cmake" ] || { echo "not built: Catch2 missing" > "$part_note_file"; return 77; }
  (cd "$build_dir" && ctest -L '^gpu$' --output-on-failure --timeout 40) | tee "$logs/tests.log"
  local passed failed skipped expected
  passed=$(grep -cE 'Test +#[0-9]+: .* Passed' "$logs/tests.log")
  failed=$(grep -cE 'Test +#[0-9]+: .*\*\*\*(Failed|Timeout|Exception)|Test +#[0-9]+: .*(Not Run|SEGFAULT|Subprocess aborted|Child aborted)' "$logs/tests.log")
  skipped=$(grep -cE 'Test +#[0-9]+: .*Skipped' "$logs/tests.log")
  skip_reasons "$logs/tests.log" "$build_dir/Testing/Temporary/LastTest.log" > "$logs/skips.log"
  [ -s "$logs/skips.log" ] && { echo "skipped, and why:"; sed 's/^/  /' "$logs/skips.log"; }
  # A skip because a case needs two GPUs is what one GPU should give.
  expected=$(grep -cF "$two_gpu_reason" "$logs/skips.log")
  echo "gpu tests: passed $passed, failed $failed, skipped $skipped ($expected of them need two GPUs)" |
    tee "$part_note_file"
  [ "$failed" -eq 0 ] || return 1
  [ "$((passed + failed + skipped))" -gt 0 ] || return 1
  if [ "$mode" = gpu ] && [ "$skipped" -gt "$expected" ]; then
    echo "run.sh: a gpu test skipped on a GPU machine: it did not use the GPU (see its SKIPPED reason above)"
    return 1
  fi
  return 0
}

bench_args=()
[ "$quick" = 1 ] && bench_args+=(--quick)

run_part configure configure
if [ -f "$build_dir/build.ninja" ]; then
  run_part build_benchmarks build_benchmarks
  for program in $(programs_labelled '^gpu-bench$'); do
    name=$(basename "$program")
    [ -n "${LIMITS[$name]:-}" ] || LIMITS[$name]=60
    run_part "$name" run_benchmark "$program" "${bench_args[@]}"
  done
  run_part torch_anchor torch_anchor
  run_part build_tests build_tests
  run_part tests run_tests
  run_part profile profile
fi
[ "$mode" = gpu ] && nvidia-smi -L
date -u '+date: %Y-%m-%dT%H:%M:%SZ'
summary
exit $overall
