#!/usr/bin/env bash
# The test job: set up, build everything (CUDA code included), run every test: the GoogleTest
# suites (GPU tests skip where no GPU exists), the public-API fuzzer, the command line checks and
# the installed package (find_package from a temporary prefix). Extra args go to ctest (e.g. -L cpu).
# Prints how many tests passed, were skipped and failed.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
cd build
set +e
ctest --output-on-failure -j "$(nproc)" "$@" 2>&1 | tee ctest.log
rc=${PIPESTATUS[0]}
set -e
# CTest's own summary counts a skipped test as passed ("100% tests passed"); count from its lines.
passed=$(grep -Ec '^ *[0-9]+/[0-9]+ Test +#[0-9]+: .* Passed +[0-9.]+ sec' ctest.log || true)
skipped=$(grep -Ec '^ *[0-9]+/[0-9]+ Test +#[0-9]+: .*\*\*\*Skipped|^ *[0-9]+/[0-9]+ Test +#[0-9]+: .* Skipped ' ctest.log || true)
total=$(grep -Ec '^ *[0-9]+/[0-9]+ Test +#[0-9]+: ' ctest.log || true)
echo
echo "tests: $passed passed, $skipped skipped (need a GPU), $((total - passed - skipped)) failed, $total in all"
exit "$rc"
