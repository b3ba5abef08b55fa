#!/usr/bin/env bash
# The Python environment of the package, its examples and its tests: a virtual environment in
# ${GROUPMM_VENV:-.venv} with
#  - torch (${GROUPMM_TORCH:-torch==2.11.0}, the GPU machine's version). Without a GPU (nvidia-smi
#    lists none) the torch wheel comes from PyTorch's CPU wheel index
#    (${GROUPMM_TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}: about 0.2 GB, no CUDA
#    libraries) and its dependencies from the default index; where that index cannot be reached,
#    torch comes from the default index (PyPI: the CUDA build, about 4.6 GB installed, which runs
#    on the CPU as well). With a GPU, from the default index;
#  - numpy, pytest, scikit-build-core (for `pip install --no-build-isolation .`) and
#    transformers==5.17.0 (examples/hf_qwen3_moe.py and the experts-backend tests).
# Idempotent: what the environment has is kept (a second run only checks). Writes nothing outside
# the environment. Prints the environment's Python on its last line.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${GROUPMM_VENV:-.venv}
PY=$VENV/bin/python
TORCH=${GROUPMM_TORCH:-torch==2.11.0}
CPU_INDEX=${GROUPMM_TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}

pip_install() { "$PY" -m pip install -q --disable-pip-version-check "$@"; }

if [ ! -x "$PY" ]; then
  echo "python env: creating the virtual environment $VENV"
  if ! python3 -m venv "$VENV" 2>/dev/null; then
    # Debian ships venv's pip bootstrap separately (python3-venv).
    rm -rf "$VENV"
    if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
      echo "python env: installing python3-venv (apt-get)"
      { DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv ||
        { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv; }; } \
        >/dev/null
    fi
    python3 -m venv "$VENV"
  fi
fi

if ! "$PY" -c "import torch" >/dev/null 2>&1; then
  if nvidia-smi -L 2>/dev/null | grep -q '^GPU' || [ -e /dev/nvidia0 ]; then
    echo "python env: installing $TORCH (a GPU is present: the CUDA build, from the default index)"
    pip_install "$TORCH"
  else
    echo "python env: no GPU: installing $TORCH, CPU build, from $CPU_INDEX"
    if pip_install --no-deps --retries 1 --timeout 60 --index-url "$CPU_INDEX" "$TORCH"; then
      pip_install "$TORCH"  # its dependencies, from the default index (torch itself is there)
    else
      echo "python env: $CPU_INDEX cannot be reached: installing $TORCH from the default index" \
        "instead (the CUDA build: about 4.6 GB installed; it runs on the CPU as well)"
      pip_install "$TORCH"
    fi
  fi
fi

# The rest, by import name and requirement: the missing ones, one at a time (one that cannot be
# installed leaves the others in; the script then fails, naming it).
failed=()
for pair in "numpy:numpy" "pytest:pytest" "scikit_build_core:scikit-build-core>=0.10" \
  "transformers:transformers==5.17.0"; do
  "$PY" -c "import ${pair%%:*}" >/dev/null 2>&1 && continue
  echo "python env: installing ${pair#*:}"
  pip_install "${pair#*:}" || failed+=("${pair#*:}")
done
"$PY" -c "import torch; print('python env: torch', torch.__version__, '(CUDA build)' if torch.version.cuda else '(CPU build)')"
if [ ${#failed[@]} -gt 0 ]; then
  echo "python env: could not install ${failed[*]}" >&2
  exit 1
fi
case "$PY" in /*) echo "$PY" ;; *) echo "$PWD/$PY" ;; esac
