# Two isolated changes to the Asio of Boost 1.81, made at configure time on the installed headers where
# their text matches (elsewhere: a configure warning, and Asio as installed).
#
# 1. A short read is the end of what a socket has: Asio's epoll reactor, taught to know it.
# Why. Asio 1.81 reads a socket again after every read, whatever it returned, until the kernel says
# EAGAIN: a relayed SSE event costs two recv() calls (the event, then an EAGAIN on the next start),
# and a proxied request two or three more. Its reactor already skips that attempt after a read that
# returned 0 bytes ("done_and_exhausted"); it does not after a read that returned less than it asked
# for, which on a stream socket means the same thing, the receive queue was emptied, with one
# exception: a peer's FIN (or RST) that arrived together with the last data. Edge-triggered epoll then
# reports one event for both; after the short read no new edge will ever come, and a reader that waits
# for one hangs. nginx handles it by registering EPOLLRDHUP, which says "the peer closed" in that same
# event; so does this override.
# What:
#   reactive_socket_recv_op.hpp: a read into one buffer on a stream socket that returned fewer bytes than
#     the buffer holds reports "exhausted" (not a MSG_PEEK: peeked bytes stay in the queue; not a buffer
#     sequence: Asio reads at most 64 of its buffers at once);
#   epoll_reactor.hpp: a descriptor remembers that its peer shut down its side (peer_shut_down_);
#   epoll_reactor.ipp: sockets are registered with EPOLLRDHUP; an event carrying it sets
#     peer_shut_down_, which keeps reads speculative (each read returns what is left, then 0 at once)
#     and lets every queued read complete; otherwise an exhausted read waits for the next edge.
# tests/unit/support/asio_short_read_test.cpp covers the surface: data and FIN in one edge, data and
# RST, MSG_PEEK, a peer's FIN seen before a short read, and reads that fill their buffer. Known limits,
# none of which dplb meets: TCP urgent data (Linux ends a read at the urgent mark; a peer that sends it
# stalls its own connection until its next packet or its deadline), and Unix-domain stream sockets that
# pass descriptors or credentials (a read ends at such a message).
#
# 2. Freed handler and coroutine-frame memory kept per size. Asio recycles these blocks through a small
# per-thread cache (BOOST_ASIO_RECYCLING_ALLOCATOR_CACHE_SIZE slots per purpose, scanned linearly, first
# fit). A worker with more than a few requests in flight frees and takes frames in bursts (three per
# request, 240 to 992 bytes in dplb): the 16 slots overflowed, and a miss also evicted a cached block,
# so 1.4 frames per request went to malloc at 16 requests in flight. More slots cost more to scan than
# malloc does. thread_info_base.hpp now keeps freed blocks in one free list per size (in chunks of 4
# bytes, up to Asio's limit of 1,020 bytes), 256 blocks per size at most: taking and giving back a block
# is a push or a pop, and a frame always finds a block of its own size. Blocks beyond the bound, and of
# one chunk, go the old way. tests/unit/support/asio_recycling_test.cpp covers it.
#
# How. The files are copied into the build tree, edited, and the copy's directory is put before Boost's
# on dplb_asio's (public) include path, so that every translation unit sees the same Asio. Each edit must
# match the installed text exactly (it was written for Boost 1.81's Asio); each edited file also gets a
# marker macro (DPLB_ASIO_OVERRIDE_<FILE>). If any edit does not match, nothing is applied: configuring
# warns, naming the file, and dplb builds on Asio as installed (one more recv() per read, and mallocs per
# request under concurrency), which is correct, only slower. When applied, dplb_asio and its users compile
# with DPLB_ASIO_OVERRIDE=1, and include/dplb/support/asio_override_check.hpp (with
# src/support/asio_beast_impl.cpp for the .ipp) stops the build unless every marker is defined: the
# patched copies, not Boost's, are the headers compiled. tests/cmake/asio_override_test.cmake runs
# dplb_asio_override_write() on a copy of Asio with one line changed (it must warn and write nothing) and on
# the installed Asio (it must apply, and the check must pass with the copies and fail without them).
# The functions below keep these policies wherever they are called from, script mode included (where
# CMP0012 would otherwise be OLD: while(TRUE) is false there, and no edit would ever match).
cmake_policy(VERSION 3.25)

option(DPLB_ASIO_OVERRIDE
  "Build on Asio with cmake/AsioOverride.cmake's changes (short reads, recycling per size) when the installed Asio matches them"
  ON)

# The files the override edits, under boost/asio/detail/.
set(DPLB_ASIO_OVERRIDE_FILES
  reactive_socket_recv_op.hpp epoll_reactor.hpp impl/epoll_reactor.ipp thread_info_base.hpp)

# Replaces `old` by `new` in the variable named `content_var`, if `old` occurs exactly `expected_count`
# times: the edit is only safe on the exact text it was written for. Otherwise leaves it and sets the
# variable named `mismatch_var` to what did not match; does nothing once that is set.
function(dplb_asio_override_edit content_var mismatch_var file old new expected_count)
  if(NOT "${${mismatch_var}}" STREQUAL "")
    return()
  endif()
  set(text "${${content_var}}")
  set(count 0)
  set(rest "${text}")
  string(LENGTH "${old}" old_length)
  while(TRUE)
    string(FIND "${rest}" "${old}" at)
    if(at EQUAL -1)
      break()
    endif()
    math(EXPR count "${count} + 1")
    math(EXPR next "${at} + ${old_length}")
    string(SUBSTRING "${rest}" ${next} -1 rest)
  endwhile()
  if(NOT count EQUAL expected_count)
    string(REGEX MATCH "^[^\n]*" first_line "${old}")
    string(STRIP "${first_line}" first_line)
    set(${mismatch_var} "${file} (found ${count} of ${expected_count} places for the edit of \"${first_line}\")"
        PARENT_SCOPE)
    return()
  endif()
  string(REPLACE "${old}" "${new}" text "${text}")
  set(${content_var} "${text}" PARENT_SCOPE)
endfunction()

# Defines the file's marker macro right after its include guard's #define.
function(dplb_asio_override_mark content_var mismatch_var file guard marker)
  dplb_asio_override_edit(${content_var} ${mismatch_var} "${file}"
    "#define ${guard}\n"
    "#define ${guard}\n#define ${marker} 1 // dplb, cmake/AsioOverride.cmake\n"
    1)
  set(${content_var} "${${content_var}}" PARENT_SCOPE)
  set(${mismatch_var} "${${mismatch_var}}" PARENT_SCOPE)
endfunction()

# Edits Boost's Asio under `include_dir` (the directory holding boost/asio/) into copies under
# `out_dir`/boost/asio/detail and sets `applied_var` to TRUE; or, if any edit does not match the installed
# text, warns (naming the file), removes any copies an earlier run left in `out_dir` and sets it to FALSE.
# Runs in script mode too (cmake -P), for tests/cmake/asio_override_test.cmake.
function(dplb_asio_override_write include_dir out_dir applied_var)
  set(asio "${include_dir}/boost/asio/detail")
  set(mismatch "")
  foreach(name IN LISTS DPLB_ASIO_OVERRIDE_FILES)
    if(NOT mismatch AND NOT EXISTS "${asio}/${name}")
      set(mismatch "${asio}/${name} (no such file)")
    endif()
  endforeach()
  if(mismatch)
    set(recv_op "")
    set(reactor_hpp "")
    set(reactor_ipp "")
    set(thread_info "")
  else()
    file(READ "${asio}/reactive_socket_recv_op.hpp" recv_op)
    file(READ "${asio}/epoll_reactor.hpp" reactor_hpp)
    file(READ "${asio}/impl/epoll_reactor.ipp" reactor_ipp)
    file(READ "${asio}/thread_info_base.hpp" thread_info)
  endif()

  set(marker "// dplb, cmake/AsioOverride.cmake")

  dplb_asio_override_edit(recv_op mismatch "${asio}/reactive_socket_recv_op.hpp"
"        if (o->bytes_transferred_ == 0)
          result = done_and_exhausted;"
"        if (o->bytes_transferred_ == 0
            || (bufs_type::is_single_buffer && !o->ec_
              && (o->flags_ & socket_base::message_peek) == 0
              && o->bytes_transferred_ < bufs_type::first(o->buffers_).size()))
          result = done_and_exhausted; ${marker}: a short read emptied the queue"
    1)

  dplb_asio_override_edit(reactor_hpp mismatch "${asio}/epoll_reactor.hpp"
"    bool try_speculative_[max_ops];
    bool shutdown_;"
"    bool try_speculative_[max_ops];
    bool shutdown_;
    bool peer_shut_down_; ${marker}: EPOLLRDHUP seen, reads never wait for an edge"
    1)

  dplb_asio_override_edit(reactor_ipp mismatch "${asio}/impl/epoll_reactor.ipp"
"  ev.events = EPOLLIN | EPOLLERR | EPOLLHUP | EPOLLPRI | EPOLLET;"
"  ev.events = EPOLLIN | EPOLLERR | EPOLLHUP | EPOLLPRI | EPOLLET | EPOLLRDHUP; ${marker}"
    2)
  dplb_asio_override_edit(reactor_ipp mismatch "${asio}/impl/epoll_reactor.ipp"
"    descriptor_data->shutdown_ = false;"
"    descriptor_data->shutdown_ = false;
    descriptor_data->peer_shut_down_ = false; ${marker}"
    2)
  dplb_asio_override_edit(reactor_ipp mismatch "${asio}/impl/epoll_reactor.ipp"
"            if (descriptor_data->registered_events_ != 0)
              descriptor_data->try_speculative_[op_type] = false;"
"            if (descriptor_data->registered_events_ != 0)
              if (op_type != read_op || !descriptor_data->peer_shut_down_) ${marker}
                descriptor_data->try_speculative_[op_type] = false;"
    1)
  dplb_asio_override_edit(reactor_ipp mismatch "${asio}/impl/epoll_reactor.ipp"
"  static const int flag[max_ops] = { EPOLLIN, EPOLLOUT, EPOLLPRI };"
"  if (events & EPOLLRDHUP) ${marker}
    peer_shut_down_ = true;
  static const int flag[max_ops] = { EPOLLIN, EPOLLOUT, EPOLLPRI };"
    1)
  dplb_asio_override_edit(reactor_ipp mismatch "${asio}/impl/epoll_reactor.ipp"
"          if (status == reactor_op::done_and_exhausted)
          {
            try_speculative_[j] = false;
            break;
          }"
"          if (status == reactor_op::done_and_exhausted
              && (j != read_op || !peer_shut_down_)) ${marker}
          {
            try_speculative_[j] = false;
            break;
          }"
    1)

  dplb_asio_override_edit(thread_info mismatch "${asio}/thread_info_base.hpp"
"    for (int i = 0; i < max_mem_index; ++i)
      reusable_memory_[i] = 0;
  }"
"    for (int i = 0; i < max_mem_index; ++i)
      reusable_memory_[i] = 0;
    for (int i = 0; i <= UCHAR_MAX; ++i) ${marker}
    {
      free_blocks_[i] = 0;
      free_block_counts_[i] = 0;
    }
  }"
    1)
  dplb_asio_override_edit(thread_info mismatch "${asio}/thread_info_base.hpp"
"      if (reusable_memory_[i])
        aligned_delete(reusable_memory_[i]);
    }
  }"
"      if (reusable_memory_[i])
        aligned_delete(reusable_memory_[i]);
    }
    for (int i = 0; i <= UCHAR_MAX; ++i) ${marker}
    {
      while (void* const block = free_blocks_[i])
      {
        std::memcpy(&free_blocks_[i], block, sizeof(void*));
        aligned_delete(block);
      }
    }
  }"
    1)
  dplb_asio_override_edit(thread_info mismatch "${asio}/thread_info_base.hpp"
"    std::size_t chunks = (size + chunk_size - 1) / chunk_size;

    if (this_thread)
    {"
"    std::size_t chunks = (size + chunk_size - 1) / chunk_size;

    if (this_thread && chunks >= 2 && chunks <= UCHAR_MAX) ${marker}: a block of this size
    {
      void* const pointer = this_thread->free_blocks_[chunks];
      if (pointer && reinterpret_cast<std::size_t>(pointer) % align == 0)
      {
        std::memcpy(&this_thread->free_blocks_[chunks], pointer, sizeof(void*));
        --this_thread->free_block_counts_[chunks];
        unsigned char* const mem = static_cast<unsigned char*>(pointer);
        mem[size] = static_cast<unsigned char>(chunks);
        return pointer;
      }
    }

    if (this_thread)
    {"
    1)
  dplb_asio_override_edit(thread_info mismatch "${asio}/thread_info_base.hpp"
"    if (size <= chunk_size * UCHAR_MAX)
    {
      if (this_thread)
      {"
"    if (size <= chunk_size * UCHAR_MAX)
    {
      if (this_thread) ${marker}: onto the free list of its size
      {
        const unsigned char chunks = static_cast<unsigned char*>(pointer)[size];
        if (chunks >= 2 && this_thread->free_block_counts_[chunks] < max_free_blocks)
        {
          std::memcpy(pointer, &this_thread->free_blocks_[chunks], sizeof(void*));
          this_thread->free_blocks_[chunks] = pointer;
          ++this_thread->free_block_counts_[chunks];
          return;
        }
      }
      if (this_thread)
      {"
    1)
  dplb_asio_override_edit(thread_info mismatch "${asio}/thread_info_base.hpp"
"  void* reusable_memory_[max_mem_index];
"
"  void* reusable_memory_[max_mem_index];
  ${marker}: freed blocks by size in chunks, each list linked through the blocks' first bytes
  enum { max_free_blocks = 256 };
  void* free_blocks_[UCHAR_MAX + 1];
  unsigned short free_block_counts_[UCHAR_MAX + 1];
"
    1)
  dplb_asio_override_edit(thread_info mismatch "${asio}/thread_info_base.hpp"
"#include <cstddef>
"
"#include <cstddef>
#include <cstring> ${marker}
"
    1)

  # Each copy defines its marker (include/dplb/support/asio_override_check.hpp checks them).
  foreach(args
      "recv_op;reactive_socket_recv_op.hpp;REACTIVE_SOCKET_RECV_OP_HPP"
      "reactor_hpp;epoll_reactor.hpp;EPOLL_REACTOR_HPP"
      "reactor_ipp;impl/epoll_reactor.ipp;IMPL_EPOLL_REACTOR_IPP"
      "thread_info;thread_info_base.hpp;THREAD_INFO_BASE_HPP")
    list(GET args 0 var)
    list(GET args 1 name)
    list(GET args 2 guard)
    dplb_asio_override_mark(${var} mismatch "${asio}/${name}"
      BOOST_ASIO_DETAIL_${guard} DPLB_ASIO_OVERRIDE_${guard})
  endforeach()

  if(mismatch)
    message(WARNING
      "dplb's Asio override (cmake/AsioOverride.cmake) does not match ${mismatch}: it was written for the Asio "
      "of Boost 1.81. dplb builds on Asio as installed, which is correct but slower: one more recv() per read "
      "(a short read does not end the socket's data) and mallocs per request under concurrency (no free list "
      "per size for handler and coroutine-frame memory). -DDPLB_ASIO_OVERRIDE=OFF says so and silences this.")
    file(REMOVE_RECURSE "${out_dir}/boost")
    set(${applied_var} FALSE PARENT_SCOPE)
    return()
  endif()

  # Written only when changed, so that a re-configure does not rebuild everything. (A build directory made
  # before a file was added to this list has objects whose recorded dependency is Boost's copy: build it
  # from clean once.)
  foreach(pair "reactive_socket_recv_op.hpp;recv_op" "epoll_reactor.hpp;reactor_hpp"
               "impl/epoll_reactor.ipp;reactor_ipp" "thread_info_base.hpp;thread_info")
    list(GET pair 0 name)
    list(GET pair 1 var)
    set(path "${out_dir}/boost/asio/detail/${name}")
    set(old_content "")
    if(EXISTS "${path}")
      file(READ "${path}" old_content)
    endif()
    if(NOT old_content STREQUAL "${${var}}")
      file(WRITE "${path}" "${${var}}")
    endif()
  endforeach()
  set(${applied_var} TRUE PARENT_SCOPE)
endfunction()

# The directory of Boost::headers that holds Asio, in the variable named `var` (empty if none does).
function(dplb_asio_include_dir var)
  get_target_property(boost_includes Boost::headers INTERFACE_INCLUDE_DIRECTORIES)
  set(${var} "" PARENT_SCOPE)
  foreach(dir IN LISTS boost_includes)
    if(EXISTS "${dir}/boost/asio/detail/impl/epoll_reactor.ipp")
      set(${var} "${dir}" PARENT_SCOPE)
      break()
    endif()
  endforeach()
endfunction()

# Applies the override to `target` when it matches the installed Asio: the patched copies go under
# `out_dir`, which is put on `target`'s public include path before Boost's, with DPLB_ASIO_OVERRIDE=1.
function(dplb_asio_override target out_dir)
  dplb_asio_include_dir(include_dir)
  set(applied FALSE)
  if(include_dir)
    dplb_asio_override_write("${include_dir}" "${out_dir}" applied)
    # A Boost upgrade re-runs the configuration, which checks the edits again.
    foreach(name IN LISTS DPLB_ASIO_OVERRIDE_FILES)
      set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS "${include_dir}/boost/asio/detail/${name}")
    endforeach()
  else()
    message(WARNING "dplb's Asio override: Asio's epoll reactor was not found under Boost's include directories; "
      "dplb builds on Asio as installed (-DDPLB_ASIO_OVERRIDE=OFF silences this).")
  endif()
  if(applied)
    message(STATUS "dplb's Asio override (cmake/AsioOverride.cmake): applied")
    # SYSTEM: Boost's code, not ours, so the project's warnings (and -Werror) do not apply; still searched
    # before /usr/include, where Boost is.
    target_include_directories(${target} SYSTEM BEFORE PUBLIC "${out_dir}")
    target_compile_definitions(${target} PUBLIC DPLB_ASIO_OVERRIDE=1)
  endif()
endfunction()
