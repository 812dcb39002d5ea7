#pragma once
// The accept side of one worker thread. Each worker owns an acceptor bound to the same address with
// SO_REUSEPORT, so the kernel spreads new connections over the workers without a hand-off between
// threads; each accepted connection is served by a session coroutine on the accepting worker.

#include <boost/asio/ip/tcp.hpp>

#include "dplb/server/proxy_context.hpp"
#include "dplb/support/io_types.hpp"

namespace dplb::server {

// Opens, binds (SO_REUSEADDR + SO_REUSEPORT) and listens. Throws boost::system::system_error when the
// address cannot be bound (start-up only).
io::acceptor open_acceptor(const io::executor& executor, const boost::asio::ip::tcp::endpoint& endpoint);

// Accepts until the acceptor is closed, spawning one session per connection. Run under supervision
// (support::task::accept): a restart takes up where it stopped, with the same acceptor.
io::task<void> accept_loop(worker_state& worker, io::acceptor& acceptor);

}  // namespace dplb::server
