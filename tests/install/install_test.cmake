# `cmake --install` into a temporary prefix: exactly bin/vigil is installed (nothing test-only), and
# the installed binary runs: `vigil --version` prints the project version, `vigil --help` lists the
# subcommands. Run by ctest (tests/CMakeLists.txt) as
#   cmake -DBUILD_DIR=<build> -DPREFIX=<tmp prefix> -DVERSION=<x.y.z> -P install_test.cmake
file(REMOVE_RECURSE "${PREFIX}")
execute_process(COMMAND "${CMAKE_COMMAND}" --install "${BUILD_DIR}" --prefix "${PREFIX}"
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "cmake --install failed (${rc}):\n${out}\n${err}")
endif()
file(GLOB_RECURSE installed LIST_DIRECTORIES false RELATIVE "${PREFIX}" "${PREFIX}/*")
if(NOT installed STREQUAL "bin/vigil")
  message(FATAL_ERROR "expected bin/vigil alone to be installed, got: ${installed}")
endif()
execute_process(COMMAND "${PREFIX}/bin/vigil" --version RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
string(STRIP "${out}" out)
if(NOT rc EQUAL 0 OR NOT out STREQUAL "vigil ${VERSION}")
  message(FATAL_ERROR "installed vigil --version: exit ${rc}, printed '${out}' (expected 'vigil ${VERSION}'); ${err}")
endif()
execute_process(COMMAND "${PREFIX}/bin/vigil" --help RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
foreach(cmd detect model bench topo aggregator edge)
  if(NOT rc EQUAL 0 OR NOT out MATCHES "\n  ${cmd} ")
    message(FATAL_ERROR "installed vigil --help: exit ${rc}, subcommand '${cmd}' not listed:\n${out}${err}")
  endif()
endforeach()
file(REMOVE_RECURSE "${PREFIX}")
message(STATUS "installed bin/vigil runs: ${PREFIX}")
