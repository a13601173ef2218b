# Helpers shared by every folder: warnings, and the single way tests are registered.

# geo_set_warnings(<target>): the project's warning policy (zero warnings under -Wall -Wextra).
function(geo_set_warnings target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor>
    $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall,-Wextra>)
endfunction()

# geo_add_library(<name> SOURCES ... [DEPS ...] [PRIVATE_DEPS ...])
# One library target per folder; include paths are rooted at the repository so
# headers are included as "common/status.h", "kernels/qsgd.h", ...
function(geo_add_library name)
  cmake_parse_arguments(ARG "" "" "SOURCES;DEPS;PRIVATE_DEPS" ${ARGN})
  add_library(${name} STATIC ${ARG_SOURCES})
  target_include_directories(${name} PUBLIC ${PROJECT_SOURCE_DIR})
  target_link_libraries(${name} PUBLIC ${ARG_DEPS} PRIVATE ${ARG_PRIVATE_DEPS})
  geo_set_warnings(${name})
endfunction()

# geo_add_test(<name> SOURCES ... [DEPS ...] [LABELS ...] [TIMEOUT s] [RUN_SERIAL]
#              [PARALLEL_CASES filter])
# Builds one GoogleTest binary and registers each of its test cases with ctest
# through gtest_discover_tests, so ctest reports (and can filter) single cases.
# RUN_SERIAL: its cases measure time (link emulation); ctest runs them with
# nothing else in parallel so a loaded CPU cannot skew them.
# PARALLEL_CASES (with RUN_SERIAL): a GoogleTest filter ("Suite.*:Other.*")
# naming the cases that measure nothing in wall-clock time (simulated time,
# or waits whose length no check reads): those run beside other tests, the
# rest serially. Serial cases hold the whole machine, so every minute moved
# out of them is nearly a minute off the suite's wall time.
function(geo_add_test name)
  cmake_parse_arguments(ARG "RUN_SERIAL" "TIMEOUT;PARALLEL_CASES" "SOURCES;DEPS;LABELS" ${ARGN})
  set(serial FALSE)
  if(ARG_RUN_SERIAL)
    set(serial TRUE)
  endif()
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 300)
  endif()
  add_executable(${name} ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE ${ARG_DEPS} GTest::gtest GTest::gtest_main)
  target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR})
  geo_set_warnings(${name})
  # PROPERTIES reach the generated CTest file through two rounds of list
  # expansion (CMake 3.25's GoogleTestAddTests), which split an unescaped
  # list into separate arguments and kept only the first label: each ';'
  # needs four backslashes (written eight times here) to arrive as one
  # LABELS value. `ctest -N -L reconcile` lists the tests of a later label.
  string(REPLACE ";" "\\\\\\\\\\\\\\\\;" labels "${ARG_LABELS}")
  if(ARG_PARALLEL_CASES)
    if(NOT ARG_RUN_SERIAL)
      message(FATAL_ERROR "geo_add_test(${name}): PARALLEL_CASES needs RUN_SERIAL")
    endif()
    # Two discoveries of one binary, with filters that split its cases
    # between them (gtest's "-" negates the whole list after it).
    gtest_discover_tests(${name} TEST_FILTER "${ARG_PARALLEL_CASES}"
      PROPERTIES TIMEOUT ${ARG_TIMEOUT} LABELS "${labels}" RUN_SERIAL FALSE
      DISCOVERY_TIMEOUT 60)
    gtest_discover_tests(${name} TEST_FILTER "-${ARG_PARALLEL_CASES}"
      PROPERTIES TIMEOUT ${ARG_TIMEOUT} LABELS "${labels}" RUN_SERIAL TRUE
      DISCOVERY_TIMEOUT 60)
  else()
    gtest_discover_tests(${name}
      PROPERTIES TIMEOUT ${ARG_TIMEOUT} LABELS "${labels}" RUN_SERIAL ${serial}
      DISCOVERY_TIMEOUT 60)
  endif()
endfunction()
