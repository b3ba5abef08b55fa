# Tests beyond the GoogleTest suites (included by the top-level CMakeLists.txt when tests are on):
# the public-API fuzzer, the command line, and the installed CMake package. CTest label cpu: they
# need no GPU.

# ---- fuzzing the public API on the CPU backend (a few seconds; scripts/sanitize_cpu.sh runs it
# under AddressSanitizer + UndefinedBehaviorSanitizer)
add_executable(groupmm_fuzz tests/fuzz/fuzz_api.cpp tests/fuzz/fuzz_moe_qgemm.cpp)
target_link_libraries(groupmm_fuzz PRIVATE groupmm_lib)
target_include_directories(groupmm_fuzz PRIVATE ${PROJECT_SOURCE_DIR}/tests/fuzz)
target_compile_options(groupmm_fuzz PRIVATE ${_harness_flags})
add_test(NAME fuzz.public_api_cpu COMMAND groupmm_fuzz --seconds 3 --seed 1)
# One OpenMP thread: the cases are tiny, and waking a team per parallel region costs more than the
# work on a loaded machine.
set_tests_properties(fuzz.public_api_cpu PROPERTIES LABELS cpu TIMEOUT 120 ENVIRONMENT OMP_NUM_THREADS=1)

# ---- the command line: usage errors, --help without a GPU, exit codes, CPU runs
if(GROUPMM_BUILD_TOOLS)
  add_test(NAME cli.command_line
    COMMAND bash ${PROJECT_SOURCE_DIR}/tests/cli/test_cli.sh $<TARGET_FILE:groupmm_cli>)
  set_tests_properties(cli.command_line PROPERTIES LABELS cpu TIMEOUT 600)
endif()

# ---- the package: install to a temporary prefix, build examples/ against it with
# find_package(groupmm) and run it (CPU); add_subdirectory() from a parent project configures with
# the tests off
if(GROUPMM_INSTALL)
  add_test(NAME package.find_package_example
    COMMAND bash ${PROJECT_SOURCE_DIR}/tests/package/test_package.sh
            ${PROJECT_SOURCE_DIR} ${PROJECT_BINARY_DIR} ${CUDAToolkit_BIN_DIR})
  set_tests_properties(package.find_package_example PROPERTIES LABELS cpu TIMEOUT 900)
endif()

# ---- the performance document: its tables equal what bench/perf_doc.py renders from bench/data
# (also a pytest case; this one runs where torch, and so the Python suite, is missing)
find_package(Python3 COMPONENTS Interpreter)
if(Python3_Interpreter_FOUND)
  add_test(NAME docs.performance_tables
    COMMAND ${Python3_EXECUTABLE} ${PROJECT_SOURCE_DIR}/bench/perf_doc.py --check)
  set_tests_properties(docs.performance_tables PROPERTIES LABELS cpu TIMEOUT 60)
endif()
