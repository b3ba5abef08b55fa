#!/usr/bin/env bash
# The CPU tests under AddressSanitizer + UndefinedBehaviorSanitizer: a separate build (build-asan/)
# whose C++ code is instrumented (the CUDA translation units are not: they compile with the flags of
# the main build, so ccache serves them), then the CPU GoogleTest suite, the public-API fuzzer and
# the command line's CPU paths. Any report fails the run. .ci/run calls it after scripts/test.sh.
#   bash scripts/sanitize_cpu.sh [FUZZ_SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="/usr/local/cuda/bin:$PATH"
# As scripts/build.sh, so that the CUDA objects of build/ come from the cache.
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$PWD}" CCACHE_NOHASHDIR=1
B=build-asan
bash scripts/setup.sh >/dev/null
gen=(); command -v ninja >/dev/null 2>&1 && gen=(-G Ninja)
san="-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer"
if [ ! -f $B/CMakeCache.txt ]; then
  # Release keeps the CUDA flags of build/ (cache hits); the C++ code gets -O1 -g for the reports,
  # the test binaries and the fuzzer -O0 -g1 (they mostly drive the library: 40% less compile time,
  # file:line still in every report).
  cmake -S . -B $B "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS="$san" \
    -DCMAKE_CXX_FLAGS_RELEASE="-O1 -g -DNDEBUG" -DCMAKE_EXE_LINKER_FLAGS="$san" -DGROUPMM_INSTALL=OFF \
    -DGROUPMM_HARNESS_CXX_FLAGS="-O0 -g1" >/dev/null
fi
echo "sanitize_cpu: building (ASan + UBSan) in $B/"
cmake --build $B -j "${GROUPMM_JOBS:-$(nproc)}" --target groupmm_tests_cpu groupmm_fuzz groupmm_cli >$B/build.log 2>&1 ||
  { tail -30 $B/build.log; echo "sanitize_cpu: BUILD FAILED"; exit 1; }
# The CUDA runtime, linked statically, keeps a few allocations for the life of the process when no
# driver is present: those are the only leak reports suppressed.
# allocator_may_return_null: a huge allocation returns null (groupmm throws Error), as without ASan.
export ASAN_OPTIONS="abort_on_error=1:detect_leaks=1:allocator_may_return_null=1:detect_stack_use_after_return=1"
export LSAN_OPTIONS="suppressions=$PWD/tests/sanitize/lsan.supp:print_suppressions=0"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
status=0
run() {
  local name=$1; shift
  if "$@" >"$B/$name.log" 2>&1; then
    echo "  $name: clean ($(tail -1 "$B/$name.log"))"
  else
    status=1; echo "  $name: FAILED"; grep -E "ERROR|runtime error|SUMMARY|FAILED" "$B/$name.log" | head -20
  fi
}
echo "sanitize_cpu: running"
run cpu_tests ./$B/groupmm_tests_cpu --gtest_brief=1
OMP_NUM_THREADS=1 run fuzz ./$B/groupmm_fuzz --seconds "${1:-20}" --seed "$RANDOM"
run cli bash tests/cli/test_cli.sh ./$B/groupmm
[ $status = 0 ] && echo "sanitize_cpu: clean" || echo "sanitize_cpu: FAILED (logs in $B/)"
exit $status
