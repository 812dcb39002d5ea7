#pragma once
// The admin API's own listener: a separate acceptor (never the public one, whose paths all go to the
// engines), serving admin_api over HTTP/1.1 with everything bounded, so that a slow or hostile peer cannot
// hold it: request head and body size, read time, and connections open at once.

#include <boost/asio/ip/tcp.hpp>
#include <chrono>
#include <cstddef>

#include "dplb/admin/admin_api.hpp"
#include "dplb/support/io_types.hpp"

namespace dplb::admin {

struct listener_limits {
  std::size_t max_connections = 64;  // beyond: closed at once (an operator's tool needs a handful)
  std::uint32_t max_head_bytes = 16 * 1024;
  std::size_t max_body_bytes = 64 * 1024;  // the largest body of any admin request is a few dozen bytes
  std::chrono::milliseconds read_timeout{10'000};  // a whole request, keep-alive wait included
  std::chrono::milliseconds write_timeout{10'000};
};

// Opens, binds (SO_REUSEADDR, but not SO_REUSEPORT: a second process must not share the admin port) and
// listens. Throws boost::system::system_error when the address cannot be bound (start-up only).
io::acceptor open_acceptor(const io::executor& executor, const boost::asio::ip::tcp::endpoint& endpoint);

// Accepts until the acceptor is closed; each connection is served by a coroutine on the same executor.
// `api` and `acceptor` must outlive every coroutine spawned (they live as long as the event loop).
io::task<void> accept_loop(const admin_api& api, io::acceptor& acceptor, listener_limits limits = {});

}  // namespace dplb::admin
