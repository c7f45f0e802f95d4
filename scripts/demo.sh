#!/usr/bin/env bash
# The main job (README's first command): builds the examples and runs baton-train with its
# defaults, a transformer LM trained on 4 ranks (pp 2 x cp 2) that are threads of one process.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
cmake --workflow --preset demo
