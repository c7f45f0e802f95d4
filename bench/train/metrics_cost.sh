#!/bin/sh
# The step-time cost of baton-train's --metrics and --trace (issue 28: goal <= 1 %), measured
# with interleaved runs: PAIRS pairs of the same run (the defaults, STEPS steps, no
# generation) with --metrics FILE.jsonl --trace FILE.json and without, the order alternating
# from pair to pair. The training loop's time of a run is its wall time less that of a
# 1-step run (start-up: Kokkos, the text, the first step; the median of 3), and a pair's
# cost is (on - off) / off. Prints the median and the range over the pairs:
#   metrics_trace_cost: 0.004 (min -0.010, max 0.015)
# Usage: bench/train/metrics_cost.sh path/to/baton-train [PAIRS [STEPS]]
set -eu
exe=$1
pairs=${2:-6}
steps=${3:-40}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
now() { date +%s.%N; }
run() {  # run STEPS [extra flags]: prints the wall seconds
  n=$1; shift
  t0=$(now)
  "$exe" --steps "$n" --generate 0 --log-every 1000 "$@" > /dev/null
  t1=$(now)
  echo "$t1 - $t0" | bc -l
}
start=$( (run 1; run 1; run 1) | sort -g | sed -n 2p)
costs=""
i=0
while [ "$i" -lt "$pairs" ]; do
  if [ $((i % 2)) -eq 0 ]; then
    off=$(run "$steps")
    on=$(run "$steps" --metrics "$work/m.jsonl" --trace "$work/t.json")
  else
    on=$(run "$steps" --metrics "$work/m.jsonl" --trace "$work/t.json")
    off=$(run "$steps")
  fi
  cost=$(echo "(($on - $start) - ($off - $start)) / ($off - $start)" | bc -l)
  echo "pair $i: off $off s, on $on s (start-up $start s): cost $cost" >&2
  costs="$costs $cost"
  i=$((i + 1))
done
echo "$costs" | tr ' ' '\n' | sed '/^$/d' | sort -g > "$work/costs"
n=$(wc -l < "$work/costs")
median=$(sed -n "$(((n + 1) / 2))p" "$work/costs")
printf 'metrics_trace_cost: %.4f (min %.4f, max %.4f)\n' "$median" "$(head -1 "$work/costs")" "$(tail -1 "$work/costs")"
