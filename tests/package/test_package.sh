#!/usr/bin/env bash
# CTest package.find_package_example: installs the built groupmm into a temporary prefix, builds
# examples/ against it through find_package(groupmm) and runs the example on the CPU backend; then
# configures a parent project that add_subdirectory()s the source tree, where groupmm::groupmm must
# exist and the tests must be off. Usage: test_package.sh SOURCE_DIR BUILD_DIR [CUDA_BIN_DIR]
set -euo pipefail
src=$1 build=$2
[ -n "${3:-}" ] && export PATH="$3:$PATH"
tmp=$(mktemp -d "${TMPDIR:-/tmp}/groupmm_package.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
gen=(); command -v ninja >/dev/null 2>&1 && gen=(-G Ninja)
fail() { echo "FAIL: $*" >&2; exit 1; }

echo "== cmake --install into $tmp/prefix"
cmake --install "$build" --prefix "$tmp/prefix" >"$tmp/install.log" || { cat "$tmp/install.log"; fail "install"; }
for f in include/groupmm/core.hpp include/groupmm/gemm.hpp include/groupmm/nn/grouped_linear.hpp \
         include/groupmm/version.hpp bin/groupmm; do
  [ -e "$tmp/prefix/$f" ] || fail "not installed: $f"
done
compgen -G "$tmp/prefix/lib*/libgroupmm.a" >/dev/null || fail "not installed: libgroupmm.a"
compgen -G "$tmp/prefix/lib*/cmake/groupmm/groupmmConfig.cmake" >/dev/null || fail "no CMake package"
echo "installed: $(cd "$tmp/prefix" && find . -type f | wc -l) files"

echo "== examples/ against the installed package (find_package(groupmm))"
cmake -S "$src/examples" -B "$tmp/example" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$tmp/prefix" >"$tmp/example.log" 2>&1 || { cat "$tmp/example.log"; fail "configure"; }
cmake --build "$tmp/example" >>"$tmp/example.log" 2>&1 || { cat "$tmp/example.log"; fail "build"; }
"$tmp/example/grouped_gemm" --cpu | tee "$tmp/run.log"
grep -q "worst relative error" "$tmp/run.log" || fail "the example did not compute"
grep -q "reported by Context::check()" "$tmp/run.log" || fail "the bad split was not reported"

echo "== add_subdirectory() from a parent project"
mkdir -p "$tmp/parent"
cat >"$tmp/parent/CMakeLists.txt" <<CMAKE
cmake_minimum_required(VERSION 3.25)
project(parent LANGUAGES CXX)
add_subdirectory("$src" groupmm)
if(NOT TARGET groupmm::groupmm)
  message(FATAL_ERROR "groupmm::groupmm is not defined")
endif()
if(TARGET groupmm_tests_cpu OR TARGET groupmm_cli)
  message(FATAL_ERROR "tests or tools are built in a parent project")
endif()
CMAKE
cmake -S "$tmp/parent" -B "$tmp/parent/build" "${gen[@]}" >"$tmp/parent.log" 2>&1 ||
  { cat "$tmp/parent.log"; fail "add_subdirectory configure"; }
echo "add_subdirectory: configured, groupmm::groupmm defined, tests and tools off"
echo "PASS"
