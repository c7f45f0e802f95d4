#!/usr/bin/env bash
# The main job: builds the examples and runs the demo (README's first command).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
cmake --workflow --preset demo
