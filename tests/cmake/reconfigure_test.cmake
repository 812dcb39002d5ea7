# Configuring a build directory a second time, with the same options, must give every build step the same
# command (what `ninja -t commands` prints, what Ninja compares to decide a step is dirty): a command line that
# differs between the first configure and later ones rebuilds everything it touches on the
# next build (scripts/package.sh reconfigures; a pkg-config imported target once moved a flag on every second
# run and rebuilt all of dplb_core under the tests). Run by CTest in script mode:
#   cmake -DSOURCE_DIR=<dplb's source> -DWORK_DIR=<scratch dir> -DNINJA=<ninja> -P reconfigure_test.cmake
cmake_minimum_required(VERSION 3.25)

foreach(var SOURCE_DIR WORK_DIR NINJA)
  if(NOT ${var})
    message(FATAL_ERROR "reconfigure_test: -D${var}=... is required")
  endif()
endforeach()

file(REMOVE_RECURSE "${WORK_DIR}")

function(configure out_var)
  execute_process(
    COMMAND "${CMAKE_COMMAND}" -S "${SOURCE_DIR}" -B "${WORK_DIR}" -G Ninja "-DCMAKE_MAKE_PROGRAM=${NINJA}"
            -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDPLB_ASIO_OVERRIDE=ON
    OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "reconfigure_test: configuring failed (${rc}):\n${out}\n${err}")
  endif()
  execute_process(COMMAND "${NINJA}" -C "${WORK_DIR}" -t commands
    OUTPUT_VARIABLE commands ERROR_VARIABLE err RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0 OR commands STREQUAL "")
    message(FATAL_ERROR "reconfigure_test: ninja -t commands failed (${rc}):\n${err}")
  endif()
  set(${out_var} "${commands}" PARENT_SCOPE)
endfunction()

configure(first)
configure(second)
file(REMOVE_RECURSE "${WORK_DIR}")
if(NOT first STREQUAL second)
  # The first differing command says which step would rebuild.
  string(REPLACE "\n" ";" first_lines "${first}")
  string(REPLACE "\n" ";" second_lines "${second}")
  list(LENGTH first_lines count)
  math(EXPR last "${count} - 1")
  foreach(i RANGE ${last})
    list(GET first_lines ${i} a)
    list(LENGTH second_lines second_count)
    if(i GREATER_EQUAL second_count)
      break()
    endif()
    list(GET second_lines ${i} b)
    if(NOT a STREQUAL b)
      message(FATAL_ERROR "reconfigure_test: a command changed on the second configure (command ${i}):\n"
        "first:  ${a}\nsecond: ${b}")
    endif()
  endforeach()
  message(FATAL_ERROR "reconfigure_test: the second configure gave a different number of commands")
endif()
message(STATUS "reconfigure_test: the second configure gave every step the same command")
