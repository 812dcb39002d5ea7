# Small functions that apply the project's warnings and sanitizers per target.

# Warnings every dplb target compiles with; DPLB_WERROR turns them into errors.
function(dplb_apply_warnings target)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wpedantic -Wno-unused-parameter)
  if(DPLB_WERROR)
    target_compile_options(${target} PRIVATE -Werror)
  endif()
endfunction()

# DPLB_SANITIZE is a comma-separated list passed to -fsanitize (e.g. "address,undefined" or "thread").
# It is applied globally in the top-level CMakeLists so that every object, including the Asio/Beast
# library, is instrumented the same way.
function(dplb_apply_sanitizers)
  if(DPLB_SANITIZE)
    add_compile_options(-fsanitize=${DPLB_SANITIZE} -fno-omit-frame-pointer -g)
    # In RelWithDebInfo (scripts/build.sh's default) a sanitizer build compiles at DPLB_SANITIZE_CODEGEN,
    # after the build type's -O2 -g (GCC takes the last -O and the last -g). -g1: line tables only, which
    # is all a sanitizer's report shows (function, file and line of each frame); full -g made every
    # translation unit build the variables' locations and types as well (var-tracking over the huge functions
    # Catch's test cases become), a third or more of its compile time. -O1: what the sanitizers' own
    # documentation suggests, cheaper to compile than -O2 and as instrumented. CI builds ASan+UBSan and TSan
    # this way; set it empty to build as the build type says.
    set(DPLB_SANITIZE_CODEGEN "-O1 -g1" CACHE STRING
        "Optimisation and debug-information flags of a RelWithDebInfo sanitizer build, after -O2 -g (empty: none)")
    if(DPLB_SANITIZE_CODEGEN)
      separate_arguments(codegen UNIX_COMMAND "${DPLB_SANITIZE_CODEGEN}")
      add_compile_options("$<$<CONFIG:RelWithDebInfo>:${codegen}>")
    endif()
    # GCC 12's flow analysis reports false maybe-uninitialized warnings in libstdc++ (std::regex,
    # std::function) once sanitizer instrumentation is on; they are not ours and would break -Werror.
    add_compile_options(-Wno-maybe-uninitialized)
    # Likewise -Wmismatched-new-delete: with ASan's instrumentation GCC 12 follows a coroutine frame from
    # Asio's recycling allocator (aligned_alloc, cmake/AsioOverride.cmake) to the frame's operator delete,
    # which hands the block back to that same allocator, and reports a mismatch that is not there.
    add_compile_options(-Wno-mismatched-new-delete)
    add_link_options(-fsanitize=${DPLB_SANITIZE})
    if(DPLB_SANITIZE MATCHES "undefined")
      add_compile_options(-fno-sanitize-recover=undefined)
    endif()
    if(DPLB_SANITIZE MATCHES "thread")
      # Asio's io_context executor brackets each post with std::atomic_thread_fence, which GCC warns TSan
      # does not model (-Wtsan). The hand-off itself goes through the scheduler's mutex, which TSan does see.
      add_compile_options(-Wno-tsan)
    endif()
  endif()
endfunction()

# ccache makes rebuilds after a branch switch or a clean clone cheap. The sloppiness settings let it
# cache translation units that use a precompiled header.
function(dplb_use_ccache)
  find_program(DPLB_CCACHE ccache)
  if(DPLB_CCACHE AND NOT CMAKE_CXX_COMPILER_LAUNCHER)
    set(CMAKE_CXX_COMPILER_LAUNCHER
        ${CMAKE_COMMAND} -E env CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime
        CCACHE_BASEDIR=${PROJECT_SOURCE_DIR} CCACHE_NOHASHDIR=1
        ${DPLB_CCACHE} PARENT_SCOPE)
  endif()
endfunction()

# With DPLB_UNITY_BUILD, `target` compiles as a unity build. Two GCC 12 warnings are false there: it takes a
# .cpp included into another for a header, and warns that a coroutine frame holds a type of that file's
# anonymous namespace (-Wsubobject-linkage); and with more inlined it follows a coroutine frame from Asio's
# recycling allocator to the frame's operator delete, which hands the block back to that same allocator
# (-Wmismatched-new-delete, as under the sanitizers). The test programs stay one translation unit per
# file: their helpers of the same name in different files' anonymous namespaces would collide.
function(dplb_unity_build target)
  if(NOT DPLB_UNITY_BUILD)
    return()
  endif()
  set_target_properties(${target} PROPERTIES UNITY_BUILD ON)
  if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    target_compile_options(${target} PRIVATE -Wno-subobject-linkage -Wno-mismatched-new-delete)
  endif()
endfunction()
