# vigil_optional_dependency(NAME DESCRIPTION FOUND_VAR PROBE)
# Resolves VIGIL_WITH_<NAME> (ON/OFF/AUTO). PROBE is CMake code that sets FOUND_VAR.
# ON and not found -> configure error; AUTO -> on when found; OFF -> skipped.
set(VIGIL_OPTIONAL_SUMMARY "")
macro(vigil_optional_dependency name desc found_var probe)
  # ON/OFF/AUTO in any spelling CMake reads as a boolean (off, FALSE, NO, 0; on, TRUE, YES, 1), as
  # tools/check_borders.py reads the cache.
  string(TOUPPER "${VIGIL_WITH_${name}}" _req)
  if(_req MATCHES "^(OFF|FALSE|NO|N|0)$")
    set(_req OFF)
  elseif(_req MATCHES "^(ON|TRUE|YES|Y|1)$")
    set(_req ON)
  endif()
  set(VIGIL_HAVE_${name} OFF)
  if(_req STREQUAL "OFF")
    set(_why "disabled (VIGIL_WITH_${name}=OFF)")
  else()
    cmake_language(EVAL CODE "${probe}")
    if(${found_var})
      set(VIGIL_HAVE_${name} ON)
      set(_why "yes")
    elseif(_req STREQUAL "ON")
      message(FATAL_ERROR "VIGIL_WITH_${name}=ON but ${desc} was not found")
    else()
      set(_why "no: ${desc} not found")
    endif()
  endif()
  list(APPEND VIGIL_OPTIONAL_SUMMARY "${name}|${_why}")
endmacro()

function(vigil_print_optional_summary)
  foreach(entry IN LISTS VIGIL_OPTIONAL_SUMMARY)
    string(REPLACE "|" ";" parts "${entry}")
    list(GET parts 0 n)
    list(GET parts 1 w)
    string(TOLOWER "${n}" nl)
    string(LENGTH "${nl}" len)
    math(EXPR pad "18 - ${len}")
    string(REPEAT " " ${pad} spaces)
    message(STATUS "  ${nl}${spaces}: ${w}")
  endforeach()
endfunction()

# vigil_warnings(target): the project's warning set.
function(vigil_warnings target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wshadow=local -Wnon-virtual-dtor -Wno-missing-field-initializers>)
  if(VIGIL_WERROR)
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Werror>)
  endif()
endfunction()

# vigil_private_includes(target): the modules' internal headers (src/<module>/…, included as "<module>/x.h") for
# the target's own sources, never exported (no PUBLIC src/): a module sees another's public headers only
# (include/vigil/<module>/), and tools/check_borders.py fails the build's tests on an include across a border.
function(vigil_private_includes target)
  target_include_directories(${target} PRIVATE ${PROJECT_SOURCE_DIR}/src)
endfunction()
