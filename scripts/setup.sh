#!/usr/bin/env bash
# Installs what the build needs on a fresh machine, and says what it installs:
#  - CUTLASS/CuTe headers: the pinned nvidia-cutlass wheel from PyPI, headers only, into .deps/;
#  - system packages (apt-get, when run as root): GoogleTest, CLI11, ninja, and ccache if it can be
#    had; copies of the GoogleTest sources and the CLI11 headers go to .deps/ too, for machines
#    that build without the packages (the lent GPU machine).
# Idempotent: a second run only checks. Writes nothing outside the checkout and the system packages.
set -euo pipefail
cd "$(dirname "$0")/.."
CUTLASS_PIN="4.2.0.0"
DEPS=.deps

# apt_install PKG...: installs system packages (root only). The package lists are refreshed only
# when a first attempt fails (a fresh container has none), so a machine that has them is not
# touched.
apt_install() {
  if ! command -v apt-get >/dev/null 2>&1 || [ "$(id -u)" != 0 ]; then
    echo "setup: cannot install $* (needs apt-get as root)" >&2
    return 1
  fi
  echo "setup: installing $* (apt-get)"
  local log
  log=$(mktemp)
  if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >"$log" 2>&1; then
    echo "setup: refreshing the package lists (apt-get update)"
    if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@"; } >"$log" 2>&1; then
      tail -5 "$log" >&2
      rm -f "$log"
      return 1
    fi
  fi
  rm -f "$log"
}

# CUTLASS headers
if [ ! -f "$DEPS/cutlass/.version" ] || [ "$(cat "$DEPS/cutlass/.version")" != "$CUTLASS_PIN" ]; then
  echo "setup: installing CUTLASS headers (nvidia-cutlass==$CUTLASS_PIN from PyPI) into $DEPS/cutlass"
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

# GoogleTest (CMake package)
if ! compgen -G "/usr/lib/*/cmake/GTest/GTestConfig.cmake" >/dev/null && ! compgen -G "/usr/lib/cmake/GTest/GTestConfig.cmake" >/dev/null \
   && [ ! -f "$DEPS/googletest/CMakeLists.txt" ]; then
  apt_install libgtest-dev || { echo "setup: GoogleTest missing and could not be installed" >&2; exit 1; }
fi
if [ -d /usr/src/googletest ] && [ ! -f "$DEPS/googletest/CMakeLists.txt" ]; then
  echo "setup: copying the GoogleTest sources into $DEPS/googletest"
  mkdir -p "$DEPS" && cp -r /usr/src/googletest "$DEPS/googletest"
fi

# CLI11 (header only; the command line tool's argument parser)
if [ ! -f /usr/include/CLI/CLI.hpp ] && [ ! -f "$DEPS/cli11/include/CLI/CLI.hpp" ]; then
  apt_install libcli11-dev || { echo "setup: CLI11 missing and could not be installed (Debian/Ubuntu: libcli11-dev)" >&2; exit 1; }
fi
if [ -f /usr/include/CLI/CLI.hpp ] && [ ! -f "$DEPS/cli11/include/CLI/CLI.hpp" ]; then
  echo "setup: copying the CLI11 headers into $DEPS/cli11"
  mkdir -p "$DEPS/cli11/include" && cp -r /usr/include/CLI "$DEPS/cli11/include/CLI"
fi

command -v ninja >/dev/null 2>&1 || apt_install ninja-build || echo "setup: ninja not available (make is used)"
command -v ccache >/dev/null 2>&1 || apt_install ccache || echo "setup: ccache not available (optional)"

command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ] || {
  echo "setup: the CUDA toolkit (nvcc) is required to build groupmm" >&2; exit 1; }
echo "setup: ok (CUTLASS $(cat "$DEPS/cutlass/.version"), GoogleTest, CLI11$(command -v ninja >/dev/null 2>&1 && echo ", ninja")$(command -v ccache >/dev/null 2>&1 && echo ", ccache"))"
