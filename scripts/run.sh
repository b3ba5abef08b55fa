#!/usr/bin/env bash
# The main job: set up, build, then run the groupmm demo (GPU if present, CPU reference otherwise).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
exec ./build/groupmm "${@:-demo}"
