# The Asio override's fallback and its compile-time check (cmake/AsioOverride.cmake), run by CTest in
# script mode: cmake -DMODULE=<AsioOverride.cmake> -DASIO_INCLUDE_DIR=<Boost's include dir>
#   -DDPLB_INCLUDE_DIR=<dplb's include/> -DCXX=<compiler> -DWORK_DIR=<scratch dir> -P asio_override_test.cmake
# 1. For each file the override edits: a copy of Asio with one line of that file changed (as a later Boost
#    might have it) must give a configure warning naming the file, apply nothing, and remove copies an
#    earlier run left.
# 2. The installed Asio must take every edit, and include/dplb/support/asio_override_check.hpp must compile
#    with DPLB_ASIO_OVERRIDE=1 on the patched copies and fail on Boost's own headers.
cmake_minimum_required(VERSION 3.25)

# The child role: what configuring does, on the given directories.
if(ROLE STREQUAL "write")
  include("${MODULE}")
  dplb_asio_override_write("${INCLUDE_DIR}" "${OUT_DIR}" applied)
  message(STATUS "applied=${applied}")
  return()
endif()

foreach(var MODULE ASIO_INCLUDE_DIR DPLB_INCLUDE_DIR CXX WORK_DIR)
  if(NOT ${var})
    message(FATAL_ERROR "asio_override_test: -D${var}=... is required")
  endif()
endforeach()

function(run_write include_dir out_dir out_var err_var)
  execute_process(
    COMMAND "${CMAKE_COMMAND}" -DROLE=write "-DMODULE=${MODULE}" "-DINCLUDE_DIR=${include_dir}" "-DOUT_DIR=${out_dir}"
            -P "${CMAKE_CURRENT_LIST_FILE}"
    OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "the override failed instead of falling back (exit ${rc}):\n${out}${err}")
  endif()
  set(${out_var} "${out}" PARENT_SCOPE)
  set(${err_var} "${err}" PARENT_SCOPE)
endfunction()

set(detail "boost/asio/detail")
file(REMOVE_RECURSE "${WORK_DIR}")

# 1. One changed line per file: each a line one of the edits must find.
foreach(change
  "reactive_socket_recv_op.hpp|if (o->bytes_transferred_ == 0)|if (o->bytes_transferred_ == 0u)"
  "epoll_reactor.hpp|bool shutdown_;|bool shutdown_ = false;"
  "impl/epoll_reactor.ipp|static const int flag[max_ops]|static constexpr int flag[max_ops]"
  "thread_info_base.hpp|void* reusable_memory_[max_mem_index];|void* reusable_memory_[max_mem_index] = {};")
  string(REGEX MATCH "^([^|]*)\\|([^|]*)\\|(.*)$" parts "${change}")
  set(name "${CMAKE_MATCH_1}")
  set(from "${CMAKE_MATCH_2}")
  set(to "${CMAKE_MATCH_3}")
  string(MAKE_C_IDENTIFIER "${name}" case)
  set(asio_copy "${WORK_DIR}/${case}/include")
  set(out_dir "${WORK_DIR}/${case}/out")
  foreach(file reactive_socket_recv_op.hpp epoll_reactor.hpp impl/epoll_reactor.ipp thread_info_base.hpp)
    configure_file("${ASIO_INCLUDE_DIR}/${detail}/${file}" "${asio_copy}/${detail}/${file}" COPYONLY)
  endforeach()
  file(READ "${asio_copy}/${detail}/${name}" text)
  string(REPLACE "${from}" "${to}" changed "${text}")
  if(changed STREQUAL text)
    message(FATAL_ERROR "the test's change of ${name} did not apply: \"${from}\" is not in Boost's copy")
  endif()
  file(WRITE "${asio_copy}/${detail}/${name}" "${changed}")
  file(WRITE "${out_dir}/${detail}/thread_info_base.hpp" "// a copy left by an earlier configure\n")

  run_write("${asio_copy}" "${out_dir}" out err)
  if(NOT out MATCHES "applied=FALSE")
    message(FATAL_ERROR "the override applied to an Asio whose ${name} does not match:\n${out}${err}")
  endif()
  string(REGEX REPLACE "[ \n]+" " " flat "${err}")  # CMake wraps a warning's lines
  string(FIND "${flat}" "CMake Warning" warned)
  string(FIND "${flat}" "${asio_copy}/${detail}/${name}" named)
  string(FIND "${flat}" "builds on Asio as installed" fallback)
  if(warned EQUAL -1 OR named EQUAL -1 OR fallback EQUAL -1)
    message(FATAL_ERROR "no warning naming ${name} and the fallback to Asio as installed:\n${err}")
  endif()
  if(EXISTS "${out_dir}/boost")
    message(FATAL_ERROR "the override left copies in ${out_dir} although it did not apply")
  endif()
  message(STATUS "${name} changed: warned, applied nothing")
endforeach()

# 2. The installed Asio.
set(out_dir "${WORK_DIR}/installed/out")
run_write("${ASIO_INCLUDE_DIR}" "${out_dir}" out err)
if(NOT out MATCHES "applied=TRUE" OR NOT err STREQUAL "")
  message(FATAL_ERROR "the override did not apply to the installed Asio (${ASIO_INCLUDE_DIR}):\n${out}${err}")
endif()
foreach(file reactive_socket_recv_op.hpp epoll_reactor.hpp impl/epoll_reactor.ipp thread_info_base.hpp)
  file(READ "${out_dir}/${detail}/${file}" text)
  if(NOT text MATCHES "#define DPLB_ASIO_OVERRIDE_[A-Z_]+ 1")
    message(FATAL_ERROR "the patched ${file} defines no marker")
  endif()
endforeach()
message(STATUS "installed Asio: applied")

# The compile-time check: passes on the copies, stops the build on Boost's own headers.
set(check_source "${WORK_DIR}/check.cpp")
file(WRITE "${check_source}" "#include \"dplb/support/asio_override_check.hpp\"\nint main() { return 0; }\n")
function(compile_check result_var output_var)
  execute_process(
    COMMAND "${CXX}" -std=c++20 -fsyntax-only -DDPLB_ASIO_OVERRIDE=1 ${ARGN} -I "${ASIO_INCLUDE_DIR}"
            -I "${DPLB_INCLUDE_DIR}" "${check_source}"
    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  set(${result_var} ${rc} PARENT_SCOPE)
  set(${output_var} "${out}${err}" PARENT_SCOPE)
endfunction()
# -I, not -isystem: the compiler drops a -I of a system directory such as /usr/include and keeps it last,
# where -isystem /usr/include would break the standard library's #include_next.
compile_check(rc output -I "${out_dir}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "asio_override_check.hpp fails on the patched copies:\n${output}")
endif()
compile_check(rc output)
string(FIND "${output}" "is Boost's, not the override's copy" stopped)
if(rc EQUAL 0 OR stopped EQUAL -1)
  message(FATAL_ERROR "asio_override_check.hpp let DPLB_ASIO_OVERRIDE=1 compile on Boost's own headers:\n${output}")
endif()
message(STATUS "asio_override_check.hpp: passes on the copies, stops the build on Boost's own headers")
file(REMOVE_RECURSE "${WORK_DIR}")
