#!/usr/bin/env bash
# Installs what the build needs on a fresh machine: CUTLASS/CuTe headers (pinned nvidia-cutlass
# wheel from PyPI, headers only, into .deps/), GoogleTest and ninja from the system, ccache if it
# can be had. Idempotent: a second run only checks.
set -euo pipefail
cd "$(dirname "$0")/.."
CUTLASS_PIN="4.2.0.0"
DEPS=.deps

apt_install() {
  if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    if [ ! -f /tmp/.groupmm_apt_updated ]; then
      apt-get update -qq >/dev/null 2>&1 && touch /tmp/.groupmm_apt_updated || true
    fi
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null 2>&1
  else
    return 1
  fi
}

# CUTLASS headers
if [ ! -f "$DEPS/cutlass/.version" ] || [ "$(cat "$DEPS/cutlass/.version")" != "$CUTLASS_PIN" ]; then
  echo "setup: installing CUTLASS headers (nvidia-cutlass==$CUTLASS_PIN) into $DEPS/cutlass"
  tmp=$(mktemp -d)
  python3 -m pip download -q --no-deps --only-binary=:all: "nvidia-cutlass==$CUTLASS_PIN" -d "$tmp"
  rm -rf "$DEPS/cutlass" && mkdir -p "$DEPS/cutlass"
  python3 - "$tmp" "$DEPS/cutlass" <<'PY'
import sys, zipfile, glob, os
whl = glob.glob(os.path.join(sys.argv[1], "nvidia_cutlass-*.whl"))[0]
prefix = "cutlass_library/source/include/"
with zipfile.ZipFile(whl) as z:
    for n in z.namelist():
        if n.startswith(prefix) and not n.endswith("/"):
            dst = os.path.join(sys.argv[2], "include", n[len(prefix):])
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            with open(dst, "wb") as f:
                f.write(z.read(n))
PY
  echo "$CUTLASS_PIN" > "$DEPS/cutlass/.version"
  rm -rf "$tmp"
fi

# GoogleTest (CMake package) and ninja
if ! compgen -G "/usr/lib/*/cmake/GTest/GTestConfig.cmake" >/dev/null && ! compgen -G "/usr/lib/cmake/GTest/GTestConfig.cmake" >/dev/null; then
  echo "setup: installing libgtest-dev"
  apt_install libgtest-dev || { echo "setup: GoogleTest missing and could not be installed" >&2; exit 1; }
fi
# A source copy too, for machines that build without the system package (the lent GPU machine).
if [ -d /usr/src/googletest ] && [ ! -f "$DEPS/googletest/CMakeLists.txt" ]; then
  mkdir -p "$DEPS" && cp -r /usr/src/googletest "$DEPS/googletest"
fi
command -v ninja >/dev/null 2>&1 || apt_install ninja-build || true
command -v ccache >/dev/null 2>&1 || apt_install ccache || echo "setup: ccache not available (optional)"

command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ] || {
  echo "setup: the CUDA toolkit (nvcc) is required to build groupmm" >&2; exit 1; }
echo "setup: ok (CUTLASS $(cat "$DEPS/cutlass/.version"))"
