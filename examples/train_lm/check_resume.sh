#!/bin/sh
# baton-train (EXE) saved and resumed, ARGS the run's flags (without --steps):
#  1. a run of 3 steps saved (--save-every 2 --keep 1: a checkpoint after step 2 and one at
#     the end, of which only the last is kept), then resumed to step 6, prints bit for bit the
#     losses of steps 3..5 of an uninterrupted 6-step run;
#     a checkpoint of another model, or one already at --steps, is refused with its message;
#  2. a run stopped by SIGINT saves after the step every rank finished, exits 130, and resumed
#     from that checkpoint prints bit for bit the losses of an uninterrupted run.
# Prints "check_resume: OK" or what differs; exit status 0 only when both hold.
exe=$1
shift
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
losses() { grep -E '^step +[0-9]+ \| loss' "$1" | sed -E 's/^step +([0-9]+) \| loss ([0-9.e+-]+) .*/\1 \2/'; }
fail() { echo "check_resume: $*"; exit 1; }

"$exe" "$@" --steps 6 > "$dir/full.txt" 2>&1 || { cat "$dir/full.txt"; fail "the uninterrupted run failed"; }
"$exe" "$@" --steps 3 --save "$dir/a" --save-every 2 --keep 1 > "$dir/first.txt" 2>&1 ||
  { cat "$dir/first.txt"; fail "the saving run failed"; }
grep -q "checkpoint: $dir/a/step-000002" "$dir/first.txt" || { cat "$dir/first.txt"; fail "no checkpoint after step 2 (--save-every 2)"; }
[ "$(ls "$dir/a" | grep -c '^step-')" = 1 ] && [ -d "$dir/a/step-000003" ] ||
  { ls -la "$dir/a"; fail "--keep 1 left other checkpoints than step-000003"; }
# Refused before any rank starts: another model (here its element type), nothing left to do.
"$exe" "$@" --steps 6 --dtype double --resume "$dir/a" > "$dir/other.txt" 2>&1
code=$?
[ "$code" = 2 ] && grep -q "holds another model: dtype is F32 in the checkpoint but F64 here" "$dir/other.txt" ||
  { cat "$dir/other.txt"; fail "a checkpoint of another model: exit $code, not the refusal naming dtype"; }
"$exe" "$@" --steps 3 --resume "$dir/a" > "$dir/done.txt" 2>&1
code=$?
[ "$code" = 2 ] && grep -q "the checkpoint continues at step 3, and --steps 3" "$dir/done.txt" ||
  { cat "$dir/done.txt"; fail "--steps at the checkpoint: exit $code, not the refusal"; }
"$exe" "$@" --steps 6 --resume "$dir/a" > "$dir/second.txt" 2>&1 || { cat "$dir/second.txt"; fail "the resumed run failed"; }
losses "$dir/full.txt" | awk '$1 >= 3' > "$dir/want.txt"
losses "$dir/second.txt" > "$dir/got.txt"
[ -s "$dir/want.txt" ] && cmp -s "$dir/want.txt" "$dir/got.txt" ||
  { echo "uninterrupted:"; cat "$dir/want.txt"; echo "resumed:"; cat "$dir/got.txt"; fail "the resumed losses differ"; }
echo "check_resume: saved after 3 steps and resumed: steps 3..5 equal the uninterrupted run's bit for bit"

"$exe" "$@" --steps 100000 --save "$dir/s" > "$dir/int.txt" 2>&1 &
pid=$!
tries=0
until grep -q "^step" "$dir/int.txt"; do
  tries=$((tries + 1))
  if [ "$tries" -gt 600 ] || ! kill -0 "$pid" 2> /dev/null; then cat "$dir/int.txt"; fail "no step printed within 60 s"; fi
  sleep 0.1
done
kill -INT "$pid"
wait "$pid"
code=$?
[ "$code" = 130 ] || { cat "$dir/int.txt"; fail "SIGINT: exit code $code, not 130"; }
saved=$(sed -nE 's/.*SIGINT: stopped after step ([0-9]+) of 100000.*checkpoint: .*/\1/p' "$dir/int.txt")
[ -n "$saved" ] || { cat "$dir/int.txt"; fail "SIGINT: no checkpoint named"; }
next=$((saved + 1))
end=$((next + 2))
"$exe" "$@" --steps "$end" > "$dir/full2.txt" 2>&1 || fail "the second uninterrupted run failed"
"$exe" "$@" --steps "$end" --resume "$dir/s" > "$dir/after.txt" 2>&1 || { cat "$dir/after.txt"; fail "resuming after SIGINT failed"; }
losses "$dir/full2.txt" | awk -v n="$next" '$1 >= n' > "$dir/want2.txt"
losses "$dir/after.txt" > "$dir/got2.txt"
[ -s "$dir/want2.txt" ] && cmp -s "$dir/want2.txt" "$dir/got2.txt" ||
  { echo "uninterrupted:"; cat "$dir/want2.txt"; echo "resumed:"; cat "$dir/got2.txt"; fail "the losses after SIGINT differ"; }
echo "check_resume: SIGINT after step $saved saved the run; resumed, steps $next..$((end - 1)) equal the uninterrupted run's bit for bit"
echo "check_resume: OK"
