#!/usr/bin/env bash
# The peers' Python kernels for the benchmarks in bench/ where the peer cannot be installed (the
# lent GPU machine has no network and no vLLM): vLLM's vendored copy of triton_kernels (pure
# Python on triton; the MXFP4 matmul_ogs vLLM runs for gpt-oss), taken from the vLLM wheel on PyPI
# (${GROUPMM_PEER_VLLM:-vllm==0.33.0}, about 340 MB downloaded, nothing installed) and put in
# .peers/triton_kernels (ignored by git; about 0.25 MB, small enough to carry to a GPU machine).
# Then: PYTHONPATH=python:.peers python3 bench/peers_w4.py (or peers_serving_w4.py); those scripts
# import `triton_kernels` first. Its triton must be the one it was vendored for (vLLM 0.33: triton
# 3.6, torch 2.11's). Idempotent: a second run only checks. Writes nothing outside .peers/ but a
# temporary directory.
set -euo pipefail
cd "$(dirname "$0")/.."
SPEC=${GROUPMM_PEER_VLLM:-vllm==0.33.0}
OUTDIR=.peers
PY=${PYTHON:-python3}
if [ -f "$OUTDIR/triton_kernels/matmul_ogs.py" ]; then
  echo "peer_kernels: $OUTDIR/triton_kernels is there (remove it to fetch again)"
  exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "peer_kernels: downloading the $SPEC wheel (no dependencies, not installed)"
"$PY" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: "$SPEC" -d "$tmp"
wheel=$(ls "$tmp"/vllm-*.whl)
"$PY" - "$wheel" "$tmp/x" <<'PY'
import sys, zipfile
prefix = "vllm/third_party/triton_kernels/"
with zipfile.ZipFile(sys.argv[1]) as z:
    names = [n for n in z.namelist() if n.startswith(prefix)]
    if not names:
        sys.exit(f"peer_kernels: {sys.argv[1]} has no {prefix} (another vLLM layout)")
    z.extractall(sys.argv[2], names)
PY
mkdir -p "$OUTDIR"
rm -rf "$OUTDIR/triton_kernels"
mv "$tmp/x/vllm/third_party/triton_kernels" "$OUTDIR/triton_kernels"
echo "$SPEC" >"$OUTDIR/triton_kernels.source"
echo "peer_kernels: ok: $OUTDIR/triton_kernels ($(find "$OUTDIR/triton_kernels" -name '*.py' | wc -l)" \
  "files, from $SPEC); use PYTHONPATH=python:$OUTDIR"
