#!/usr/bin/env bash
# The test job: set up, build everything (CUDA code included), run every test. GPU tests skip
# cleanly where no GPU exists. Extra args go to ctest (e.g. -L cpu).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
cd build && ctest --output-on-failure -j "$(nproc)" "$@"
