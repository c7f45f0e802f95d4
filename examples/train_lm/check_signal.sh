#!/bin/sh
# baton-train (EXE) stopped by SIGINT once its first step is printed: every rank finishes the
# step it is in, the ranks agree to stop after the same step, and the program says so and
# exits 130 (128 + SIGINT). Prints the output and the exit code; the ctest entry checks both.
exe=$1
shift
out=$(mktemp)
trap 'rm -f "$out"' EXIT
"$exe" "$@" > "$out" 2>&1 &
pid=$!
tries=0
until grep -q "^step" "$out"; do  # the handler is installed before the first rank starts
  tries=$((tries + 1))
  if [ "$tries" -gt 600 ] || ! kill -0 "$pid" 2> /dev/null; then
    cat "$out"
    echo "check_signal: no step printed within 60 s"
    exit 1
  fi
  sleep 0.1
done
kill -INT "$pid"
wait "$pid"
code=$?
cat "$out"
echo "exit code $code"
