# Two isolated changes to the Asio of Boost 1.81, made at configure time on the installed headers.
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
# match the installed text exactly, or configuring fails and says how to go on without them
# (-DDPLB_ASIO_OVERRIDE=OFF builds on Asio as installed: one more recv() per read, and mallocs per
# request under concurrency).
option(DPLB_ASIO_OVERRIDE "Build on Asio with cmake/AsioOverride.cmake's changes (short reads, recycling per size)" ON)

function(dplb_asio_override_edit content_var file old new expected_count)
  set(text "${${content_var}}")
  # Count the occurrences of `old`: the edit is only safe on the exact text it was written for.
  set(count 0)
  set(rest "${text}")
  while(TRUE)
    string(FIND "${rest}" "${old}" at)
    if(at EQUAL -1)
      break()
    endif()
    math(EXPR count "${count} + 1")
    string(LENGTH "${old}" old_length)
    math(EXPR next "${at} + ${old_length}")
    string(SUBSTRING "${rest}" ${next} -1 rest)
  endwhile()
  if(NOT count EQUAL expected_count)
    message(FATAL_ERROR
      "dplb's Asio override (cmake/AsioOverride.cmake) does not match ${file} (found ${count} of ${expected_count} places "
      "to edit): this Boost is not the 1.81 that scripts/setup.sh installs. Configure with "
      "-DDPLB_ASIO_OVERRIDE=OFF to build on Asio as installed.")
  endif()
  string(REPLACE "${old}" "${new}" text "${text}")
  set(${content_var} "${text}" PARENT_SCOPE)
endfunction()

# Writes the patched copies under `out_dir` and adds that directory to `target`'s public include path,
# before Boost's.
function(dplb_asio_override target out_dir)
  get_target_property(boost_includes Boost::headers INTERFACE_INCLUDE_DIRECTORIES)
  set(asio "")
  foreach(dir IN LISTS boost_includes)
    if(EXISTS "${dir}/boost/asio/detail/impl/epoll_reactor.ipp")
      set(asio "${dir}/boost/asio/detail")
      break()
    endif()
  endforeach()
  if(NOT asio)
    message(FATAL_ERROR "Asio's epoll reactor was not found under ${boost_includes}; "
      "configure with -DDPLB_ASIO_OVERRIDE=OFF")
  endif()

  set(marker "// dplb, cmake/AsioOverride.cmake")

  file(READ "${asio}/reactive_socket_recv_op.hpp" recv_op)
  dplb_asio_override_edit(recv_op reactive_socket_recv_op.hpp
"        if (o->bytes_transferred_ == 0)
          result = done_and_exhausted;"
"        if (o->bytes_transferred_ == 0
            || (bufs_type::is_single_buffer && !o->ec_
              && (o->flags_ & socket_base::message_peek) == 0
              && o->bytes_transferred_ < bufs_type::first(o->buffers_).size()))
          result = done_and_exhausted; ${marker}: a short read emptied the queue"
    1)

  file(READ "${asio}/epoll_reactor.hpp" reactor_hpp)
  dplb_asio_override_edit(reactor_hpp epoll_reactor.hpp
"    bool try_speculative_[max_ops];
    bool shutdown_;"
"    bool try_speculative_[max_ops];
    bool shutdown_;
    bool peer_shut_down_; ${marker}: EPOLLRDHUP seen, reads never wait for an edge"
    1)

  file(READ "${asio}/impl/epoll_reactor.ipp" reactor_ipp)
  dplb_asio_override_edit(reactor_ipp epoll_reactor.ipp
"  ev.events = EPOLLIN | EPOLLERR | EPOLLHUP | EPOLLPRI | EPOLLET;"
"  ev.events = EPOLLIN | EPOLLERR | EPOLLHUP | EPOLLPRI | EPOLLET | EPOLLRDHUP; ${marker}"
    2)
  dplb_asio_override_edit(reactor_ipp epoll_reactor.ipp
"    descriptor_data->shutdown_ = false;"
"    descriptor_data->shutdown_ = false;
    descriptor_data->peer_shut_down_ = false; ${marker}"
    2)
  dplb_asio_override_edit(reactor_ipp epoll_reactor.ipp
"            if (descriptor_data->registered_events_ != 0)
              descriptor_data->try_speculative_[op_type] = false;"
"            if (descriptor_data->registered_events_ != 0)
              if (op_type != read_op || !descriptor_data->peer_shut_down_) ${marker}
                descriptor_data->try_speculative_[op_type] = false;"
    1)
  dplb_asio_override_edit(reactor_ipp epoll_reactor.ipp
"  static const int flag[max_ops] = { EPOLLIN, EPOLLOUT, EPOLLPRI };"
"  if (events & EPOLLRDHUP) ${marker}
    peer_shut_down_ = true;
  static const int flag[max_ops] = { EPOLLIN, EPOLLOUT, EPOLLPRI };"
    1)
  dplb_asio_override_edit(reactor_ipp epoll_reactor.ipp
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

  file(READ "${asio}/thread_info_base.hpp" thread_info)
  dplb_asio_override_edit(thread_info thread_info_base.hpp
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
  dplb_asio_override_edit(thread_info thread_info_base.hpp
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
  dplb_asio_override_edit(thread_info thread_info_base.hpp
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
  dplb_asio_override_edit(thread_info thread_info_base.hpp
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
  dplb_asio_override_edit(thread_info thread_info_base.hpp
"  void* reusable_memory_[max_mem_index];
"
"  void* reusable_memory_[max_mem_index];
  ${marker}: freed blocks by size in chunks, each list linked through the blocks' first bytes
  enum { max_free_blocks = 256 };
  void* free_blocks_[UCHAR_MAX + 1];
  unsigned short free_block_counts_[UCHAR_MAX + 1];
"
    1)
  dplb_asio_override_edit(thread_info thread_info_base.hpp
"#include <cstddef>
"
"#include <cstddef>
#include <cstring> ${marker}
"
    1)

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
    set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS "${asio}/${name}")
  endforeach()
  # SYSTEM: Boost's code, not ours, so the project's warnings (and -Werror) do not apply; still searched
  # before /usr/include, where Boost is.
  target_include_directories(${target} SYSTEM BEFORE PUBLIC "${out_dir}")
  target_compile_definitions(${target} PUBLIC DPLB_ASIO_OVERRIDE=1)
endfunction()
