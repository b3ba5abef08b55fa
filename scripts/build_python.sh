#!/usr/bin/env bash
# Builds the torch extension in place, python/groupmm/libgroupmm_torch.so, against the torch of
# ${PYTHON:-python3} and the core library of ${GROUPMM_BUILD_DIR}, else of build/ or build-cpu/,
# the first with a built libgroupmm.a (else build/, configured here); its groupmm_lib target is
# built there first, nothing else. Downloads nothing, so it also works on the GPU machine, which
# has no network. Then: PYTHONPATH=python "$PYTHON" -c "import groupmm" (scripts/test.sh runs it
# with .venv/bin/python where python3 has no torch). `pip install --no-build-isolation .`
# (scripts/install_python.sh) builds and installs a wheel instead, linking the same built core.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=$(command -v "${PYTHON:-python3}")
case "$PY" in /*) ;; *) PY="$PWD/$PY" ;; esac
B=${GROUPMM_BUILD_DIR:-}
if [ -z "$B" ]; then
  B=build
  [ ! -f build/libgroupmm.a ] && [ -f build-cpu/libgroupmm.a ] && B=build-cpu
fi
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
