#!/usr/bin/env bash
# Builds the torch extension in place, python/groupmm/libgroupmm_torch.so, against the torch of
# ${PYTHON:-python3} and the core library of ${GROUPMM_BUILD_DIR:-build} (its groupmm_lib target is
# built there first; nothing else). Downloads nothing, so it also works on the GPU machine, which
# has no network. Then: PYTHONPATH=python python3 -c "import groupmm".
# (`pip install --no-build-isolation .` builds a wheel instead, compiling the core once more.)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=$(command -v "${PYTHON:-python3}")
case "$PY" in /*) ;; *) PY="$PWD/$PY" ;; esac
B=${GROUPMM_BUILD_DIR:-build}
export PATH="/usr/local/cuda/bin:$PATH"
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$PWD}" CCACHE_NOHASHDIR=1
gen=(); command -v ninja >/dev/null 2>&1 && gen=(-G Ninja)
jobs=${GROUPMM_JOBS:-$(nproc)}
[ -f "$B/CMakeCache.txt" ] || cmake -S . -B "$B" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release
cmake --build "$B" --target groupmm_lib -j "$jobs"
# Configured every time (seconds): another Python or torch is picked up.
[ -f "$B/python/CMakeCache.txt" ] && gen=()
cmake -S python -B "$B/python" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -Dgroupmm_DIR="$PWD/$B" \
  -DPython3_EXECUTABLE="$PY" -DGROUPMM_TORCH_OUTPUT_DIR="$PWD/python/groupmm" >/dev/null
cmake --build "$B/python" -j "$jobs"
