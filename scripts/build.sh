#!/usr/bin/env bash
# Configures and builds groupmm into build/ (Release). Extra args go to cmake --build.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="/usr/local/cuda/bin:$PATH"
# ccache: paths relative to the checkout and the build folder left out of the hash, so that
# another build folder (build-asan/) or a moved clone hits the same cache entries.
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$PWD}" CCACHE_NOHASHDIR=1
gen=(); command -v ninja >/dev/null 2>&1 && gen=(-G Ninja)
if [ ! -f build/CMakeCache.txt ]; then
  cmake -S . -B build "${gen[@]}" -DCMAKE_BUILD_TYPE=Release ${GROUPMM_CMAKE_ARGS:-}
fi
cmake --build build -j "${GROUPMM_JOBS:-$(nproc)}" "$@"
