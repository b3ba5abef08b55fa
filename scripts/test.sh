#!/usr/bin/env bash
# The test job: set up, build everything (CUDA code included), run every test: the GoogleTest
# suites (GPU tests skip where no GPU exists), the public-API fuzzer, the command line checks and
# the installed package (find_package from a temporary prefix), then the Python package's tests
# (scripts/test_python.sh). Extra args go to ctest (e.g. -L cpu).
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
# The Python package (scripts/test_python.sh: torch from PyPI when missing, the extension built in
# place, pytest); its counts join the totals (a suite skipped for want of torch counts as skipped).
(cd .. && bash scripts/test_python.sh) || rc=1
read -r p_passed p_skipped p_failed <python_tests.counts || { p_passed=0 p_skipped=0 p_failed=1; }
echo "python tests: $p_passed passed, $p_skipped skipped, $p_failed failed"
passed=$((passed + p_passed)) skipped=$((skipped + p_skipped)) total=$((total + p_passed + p_skipped + p_failed))
echo
echo "tests: $passed passed, $skipped skipped (need a GPU), $((total - passed - skipped)) failed, $total in all"
exit "$rc"
