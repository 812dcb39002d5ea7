// The one translation unit that compiles Asio and Beast (separate compilation): every other target
// sees only their declarations, which keeps a one-file change to a few seconds of rebuild.
#include "reactor_memory.hpp"  // first: it changes how Asio's reactor allocates (see there)

#include <boost/asio/impl/src.hpp>
#include <boost/beast/src.hpp>

#include "dplb/support/asio_override_check.hpp"

// The reactor's implementation is compiled here only: with the override, it must be the patched copy.
#if defined(DPLB_ASIO_OVERRIDE) && defined(BOOST_ASIO_HAS_EPOLL) && !defined(DPLB_ASIO_OVERRIDE_IMPL_EPOLL_REACTOR_IPP)
#error "DPLB_ASIO_OVERRIDE is set but boost/asio/detail/impl/epoll_reactor.ipp is Boost's, not the override's copy"
#endif

namespace dplb::support {

bool asio_override_compiled() noexcept {
#if defined(DPLB_ASIO_OVERRIDE)
  return true;
#else
  return false;
#endif
}

}  // namespace dplb::support
