#!/usr/bin/env bash
# The main job: set up, build the command line only (not the tests), then run the groupmm demo.
# With a GPU (nvidia-smi lists one, or /dev/nvidia0 exists) the full library, into build/; without
# one a CPU-only library (GROUPMM_CUDA_KERNELS=OFF: no CUDA kernels, minutes instead of an hour
# on two cores) into build-cpu/, so that the test job's full build/ is left as it is. The demo
# then runs on the CPU reference backend. Arguments replace `demo` (e.g. `bash scripts/run.sh info`).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export PATH="/usr/local/cuda/bin:$PATH"
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$PWD}" CCACHE_NOHASHDIR=1  # as scripts/build.sh
if nvidia-smi -L 2>/dev/null | grep -q '^GPU' || [ -e /dev/nvidia0 ]; then
  B=build cuda=ON
else
  B=build-cpu cuda=OFF
  echo "run: no GPU on this machine: building a CPU-only library (no CUDA kernels) into $B/;" \
    "the demo runs on the CPU reference backend"
fi
gen=(); command -v ninja >/dev/null 2>&1 && gen=(-G Ninja)
if [ ! -f "$B/CMakeCache.txt" ]; then
  # shellcheck disable=SC2086
  cmake -S . -B "$B" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DGROUPMM_CUDA_KERNELS=$cuda ${GROUPMM_CMAKE_ARGS:-}
fi
cmake --build "$B" -j "${GROUPMM_JOBS:-$(nproc)}" --target groupmm_cli
exec "./$B/groupmm" "${@:-demo}"
