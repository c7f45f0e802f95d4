#!/usr/bin/env bash
# The whole test suite, as CI runs it (README's test command):
#   1. release build + every test (includes the installed-package test and, through the
#      build, the header self-containment check and the nvcc compile check where nvcc exists);
#   2. AddressSanitizer + UndefinedBehaviorSanitizer build + every test;
#   3. ThreadSanitizer build + the tests that run ranks as threads (label "threads").
# Usage: scripts/test.sh [release|asan|tsan]...   (default: all three)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh

stages=("$@")
[ ${#stages[@]} -eq 0 ] && stages=(release asan tsan)

for stage in "${stages[@]}"; do
  preset=$stage
  [ "$stage" = release ] && preset=test
  echo "=== baton: $stage ==="
  start=$(date +%s)
  cmake --workflow --preset "$preset"
  echo "=== baton: $stage passed in $(( $(date +%s) - start )) s ==="
done
