#!/usr/bin/env bash
# Installs the groupmm PyTorch package into a virtual environment, on a fresh machine too:
#  1. scripts/setup.sh: what the C++ build needs (CUTLASS headers, GoogleTest, CLI11, ninja);
#  2. scripts/python_env.sh: the environment ${GROUPMM_VENV:-.venv} with torch (CPU wheels where
#     there is no GPU), numpy, pytest, scikit-build-core and transformers;
#  3. the core library, reused where it is built: ${GROUPMM_BUILD_DIR}, else build/, else
#     build-cpu/ (the first with a libgroupmm.a; it is brought up to date, seconds when current).
#     With none, one is built: without a GPU a CPU-only library (no CUDA kernels) into build-cpu/,
#     as scripts/run.sh builds it (a few minutes on 2 cores); with a GPU the full library into
#     build/ (the CUDA kernels: about 21 minutes and 9 GB of memory with 2 parallel jobs);
#  4. `pip install --no-build-isolation .` with the environment's pip, linking that core (through
#     GROUPMM_BUILD_DIR, python/CMakeLists.txt): only the torch extension is compiled;
#  5. an import of the installed package, from outside the checkout.
# Then: .venv/bin/python examples/train_tiny_moe.py. GROUPMM_JOBS sets the parallel compile jobs
# (default: the number of cores; the CUDA kernels take about 9 GB of memory with 2 jobs).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="/usr/local/cuda/bin:$PATH"
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$PWD}" CCACHE_NOHASHDIR=1  # as scripts/build.sh
jobs=${GROUPMM_JOBS:-$(nproc)}
export GROUPMM_JOBS=$jobs CMAKE_BUILD_PARALLEL_LEVEL=$jobs

VENV=${GROUPMM_VENV:-.venv}
case "$VENV" in /*) PY=$VENV/bin/python ;; *) PY=$PWD/$VENV/bin/python ;; esac

bash scripts/setup.sh
bash scripts/python_env.sh

B=${GROUPMM_BUILD_DIR:-}
if [ -n "$B" ] && [ ! -f "$B/groupmmConfig.cmake" ]; then
  echo "install_python: GROUPMM_BUILD_DIR=$B is not a configured build tree of groupmm" \
    "(scripts/build.sh configures build/)" >&2
  exit 1
fi
if [ -z "$B" ]; then
  for t in build build-cpu; do
    if [ -f "$t/libgroupmm.a" ] && [ -f "$t/groupmmConfig.cmake" ]; then B=$t && break; fi
  done
fi
if [ -z "$B" ]; then
  if nvidia-smi -L 2>/dev/null | grep -q '^GPU' || [ -e /dev/nvidia0 ]; then
    B=build cuda=ON
  else
    B=build-cpu cuda=OFF
  fi
  echo "install_python: no built core library: building one into $B/ (GROUPMM_CUDA_KERNELS=$cuda," \
    "$jobs jobs)"
  if [ ! -f "$B/CMakeCache.txt" ]; then
    gen=(); command -v ninja >/dev/null 2>&1 && gen=(-G Ninja)
    # shellcheck disable=SC2086
    cmake -S . -B "$B" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DGROUPMM_CUDA_KERNELS=$cuda \
      ${GROUPMM_CMAKE_ARGS:-} >/dev/null
  fi
fi
echo "install_python: the core library of $B/ (built or brought up to date)"
cmake --build "$B" --target groupmm_lib -j "$jobs"

log=$B/pip_install.log
echo "install_python: pip install --no-build-isolation . (the torch extension, linking $B/;" \
  "log: $log)"
if ! GROUPMM_BUILD_DIR=$B "$PY" -m pip install -v --disable-pip-version-check --no-build-isolation \
  . >"$log" 2>&1; then
  tail -30 "$log" >&2
  echo "install_python: pip install failed (the whole log: $log)" >&2
  exit 1
fi
(cd / && "$PY" -c "import torch, groupmm; print('install_python: ok: groupmm', \
groupmm.__file__.rsplit('/', 2)[0], 'with torch', torch.__version__)")
echo "install_python: the environment's Python: $PY (e.g. $PY examples/train_tiny_moe.py)"
