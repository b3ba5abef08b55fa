#!/usr/bin/env bash
# On the GPU machine (torch with CUDA installed, no network): builds the core library's target in
# build-dev/ (reused when `scripts/device_check.sh build` made it on this warm machine: then the
# whole check takes about 3 minutes; from nothing the 76 kernels' objects take ~5 more on 16 cores)
# and the torch extension in place, then runs the whole Python suite on the GPU: opcheck with CUDA
# tensors, values vs the reference on both backends, CUDA-graph replay with changed routing,
# torch.compile.
# A CUDA test that skips is reported in the summary; "0 skipped" is the expected result here.
# pytest missing there? Carry wheels: `pip download -d .whl pytest` here first (.whl/ is ignored).
# Usage: OUT=/some/dir bash scripts/python_gpu_check.sh        (log: $OUT/python_gpu_check.log)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out}
mkdir -p "$OUT"
log=$OUT/python_gpu_check.log
PY=${PYTHON:-python3}
{
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  "$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.is_available())"
  if ! "$PY" -c "import pytest" 2>/dev/null && ls .whl/pytest-*.whl >/dev/null 2>&1; then
    "$PY" -m pip install -q --no-index --find-links .whl pytest
  fi
  t0=$(date +%s)
  GROUPMM_BUILD_DIR=${GROUPMM_BUILD_DIR:-build-dev} PYTHON=$PY timeout 360 bash scripts/build_python.sh \
    >"$OUT/python_build.log" 2>&1 || { tail -40 "$OUT/python_build.log"; echo "BUILD FAILED"; exit 1; }
  echo "build: $(($(date +%s) - t0)) s"
  PYTHONPATH=python timeout 420 "$PY" -m pytest tests/python -q -rs -p no:cacheprovider
  echo "pytest exit $?"
} 2>&1 | tee "$log"
