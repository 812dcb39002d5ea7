# An isolated change to the Asio of Boost 1.81, made at configure time on the installed headers: a short
# read is the end of what a socket has. Asio's epoll reactor, taught to know it.
#
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
#   reactive_socket_recv_op.hpp: a read on a stream socket that returned fewer bytes than its buffers
#     hold reports "exhausted" (not a MSG_PEEK: peeked bytes stay in the queue);
#   epoll_reactor.hpp: a descriptor remembers that its peer shut down its side (peer_shut_down_);
#   epoll_reactor.ipp: sockets are registered with EPOLLRDHUP; an event carrying it sets
#     peer_shut_down_, which keeps reads speculative (each read returns what is left, then 0 at once)
#     and lets every queued read complete; otherwise an exhausted read waits for the next edge.
# tests/unit/support/asio_short_read_test.cpp covers the surface: data and FIN in one edge, data and
# RST, MSG_PEEK, a peer's FIN seen before a short read, and reads that fill their buffer.
#
# How. The files are copied into the build tree, edited, and the copy's directory is put before Boost's
# on dplb_asio's (public) include path, so that every translation unit sees the same Asio. Each edit must
# match the installed text exactly, or configuring fails and says how to go on without them
# (-DDPLB_ASIO_OVERRIDE=OFF builds on Asio as installed: one more recv() per read).
option(DPLB_ASIO_OVERRIDE "Build on Asio with cmake/AsioOverride.cmake's change (a short read ends a socket's data)" ON)

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
            || (!o->ec_ && (o->flags_ & socket_base::message_peek) == 0
              && o->bytes_transferred_ < boost::asio::buffer_size(o->buffers_)))
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

  # Written only when changed, so that a re-configure does not rebuild everything.
  foreach(pair "reactive_socket_recv_op.hpp;recv_op" "epoll_reactor.hpp;reactor_hpp"
               "impl/epoll_reactor.ipp;reactor_ipp")
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
