#!/usr/bin/env bash
# The Python package's tests (tests/python, pytest), called by scripts/test.sh after the C++ tests:
#  1. a Python with torch and pytest: ${PYTHON:-python3} when it has both (the GPU machine), else
#     the package's virtual environment, ${GROUPMM_VENV:-.venv} (scripts/python_env.sh: torch ==
#     the GPU machine's version, CPU wheels where there is no GPU, numpy, pytest, transformers; a
#     few minutes, once). Its Python, .venv/bin/python, then runs the examples too;
#  2. the extension built in place against build/ (scripts/build_python.sh);
#  3. pytest, bounded in time.
# When torch cannot be installed the suite is reported as skipped (never as passed) and the exit
# status is 0. Writes "passed skipped failed" to build/python_tests.counts for scripts/test.sh.
set -uo pipefail
cd "$(dirname "$0")/.."
counts=build/python_tests.counts
mkdir -p build
report() { echo "$1 $2 $3" >"$counts"; }
PY=${PYTHON:-python3}
if ! "$PY" -c "import torch, pytest" >/dev/null 2>&1; then
  VENV=${GROUPMM_VENV:-.venv}
  case "$VENV" in /*) PY=$VENV/bin/python ;; *) PY=$PWD/$VENV/bin/python ;; esac
  # Also when the environment exists: what it lacks (transformers, numpy) is added. A Python given
  # by PYTHON is left as it is (the GPU machine is offline).
  timeout 1500 bash scripts/python_env.sh ||
    echo "python tests: the environment $VENV is not complete (scripts/python_env.sh failed)"
  if ! "$PY" -c "import torch, pytest" >/dev/null 2>&1; then
    echo "python tests: SKIPPED (torch could not be installed)"
    report 0 1 0
    exit 0
  fi
fi
"$PY" -c "import torch; print('python tests: torch', torch.__version__, 'from', torch.__file__)"
if ! PYTHON=$PY bash scripts/build_python.sh; then
  echo "python tests: the extension failed to build"
  report 0 0 1
  exit 1
fi
PYTHONPATH=python timeout 1200 "$PY" -m pytest tests/python -q -rs -p no:cacheprovider "$@" \
  2>&1 | tee build/pytest.log
rc=${PIPESTATUS[0]}
last=$(grep -E '[0-9]+ (passed|failed|skipped|errors?)' build/pytest.log | tail -1)
n() { echo "$last" | grep -Eo "[0-9]+ $1" | grep -Eo '[0-9]+' || echo 0; }
failed=$(($(n failed) + $(n "errors?")))
[ "$rc" -ne 0 ] && [ "$failed" -eq 0 ] && failed=1  # a crash, a timeout or no test collected
report "$(n passed)" "$(n skipped)" "$failed"
exit "$rc"
