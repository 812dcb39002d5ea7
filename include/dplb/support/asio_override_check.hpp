#pragma once
// Proves, at compile time, that a translation unit built with DPLB_ASIO_OVERRIDE=1 compiles the copies
// of Asio's headers that cmake/AsioOverride.cmake patched, not Boost's own: each patched copy defines a
// marker macro after its include guard. A stock header found first (an include path out of order, a
// precompiled header made without the copies) leaves its marker undefined and stops the build here.
// The epoll reactor's .ipp is compiled in src/support/asio_beast_impl.cpp alone, which checks its marker.
#include <boost/asio/socket_base.hpp>  // before the recv op, which uses it without including it
#include <boost/asio/detail/epoll_reactor.hpp>
#include <boost/asio/detail/reactive_socket_recv_op.hpp>
#include <boost/asio/detail/thread_info_base.hpp>

#if defined(DPLB_ASIO_OVERRIDE)
#if defined(BOOST_ASIO_HAS_EPOLL) && !defined(DPLB_ASIO_OVERRIDE_EPOLL_REACTOR_HPP)
#error "DPLB_ASIO_OVERRIDE is set but boost/asio/detail/epoll_reactor.hpp is Boost's, not the override's copy"
#endif
#if !defined(DPLB_ASIO_OVERRIDE_REACTIVE_SOCKET_RECV_OP_HPP)
#error "DPLB_ASIO_OVERRIDE is set but boost/asio/detail/reactive_socket_recv_op.hpp is Boost's, not the override's copy"
#endif
#if !defined(DPLB_ASIO_OVERRIDE_THREAD_INFO_BASE_HPP)
#error "DPLB_ASIO_OVERRIDE is set but boost/asio/detail/thread_info_base.hpp is Boost's, not the override's copy"
#endif
#endif

namespace dplb::support {

// True when Asio was compiled (src/support/asio_beast_impl.cpp) with the override: lets a test check that
// the library it links agrees with the headers it was compiled with.
bool asio_override_compiled() noexcept;

}  // namespace dplb::support
