#include "mock_server.hpp"

#include <sys/resource.h>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <csignal>
#include <deque>
#include <exception>
#include <iostream>
#include <stdexcept>
#include <thread>

#include "rank_state.hpp"
#include "session.hpp"

namespace dplb::mock {
namespace {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using reuse_port = asio::detail::socket_option::boolean<SOL_SOCKET, SO_REUSEPORT>;

// Thousands of concurrent streams need thousands of descriptors; the usual soft limit is 1024.
void raise_open_file_limit() {
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur < limit.rlim_max) {
    limit.rlim_cur = limit.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &limit);
  }
}

asio::ip::address resolve_host(asio::io_context& context, const std::string& host) {
  boost::system::error_code ec;
  const auto address = asio::ip::make_address(host, ec);
  if (!ec) return address;
  tcp::resolver resolver(context);
  const auto results = resolver.resolve(host, "", ec);
  if (ec || results.empty()) throw std::runtime_error("cannot resolve --host " + host + ": " + ec.message());
  return results.begin()->endpoint().address();
}

void log_session_failure(std::exception_ptr failure) {
  if (!failure) return;
  try {
    std::rethrow_exception(failure);
  } catch (const std::exception& e) {
    std::cerr << "dplb-mock-engine: warning: connection failed: " << e.what() << '\n';
  }
}

asio::awaitable<void> accept_loop(tcp::acceptor acceptor, const mock_options& options, rank_state& rank) {
  const auto as_result = asio::as_tuple(asio::use_awaitable);
  asio::steady_timer backoff(acceptor.get_executor());
  for (;;) {
    auto [ec, socket] = co_await acceptor.async_accept(as_result);
    if (ec == asio::error::operation_aborted) co_return;
    if (ec) {
      // Out of descriptors or memory: say so, and pause rather than spin on the ready listener.
      std::cerr << "dplb-mock-engine: warning: rank " << rank.index << " accept failed: " << ec.message()
                << '\n';
      backoff.expires_after(std::chrono::milliseconds(100));
      co_await backoff.async_wait(as_result);
      continue;
    }
    // Events are small and must leave at once: Nagle would hold one back behind an unacknowledged one.
    boost::system::error_code ignored;
    socket.set_option(tcp::no_delay(true), ignored);
    asio::co_spawn(acceptor.get_executor(), serve_connection(std::move(socket), options, rank),
                   log_session_failure);
  }
}

}  // namespace

struct mock_server::impl {
  explicit impl(const mock_options& o) : options(o) {}

  void stop_all() {
    for (auto& context : contexts) context->stop();
  }

  // Declaration order is destruction order reversed: the io_contexts go first, destroying the session
  // coroutines, which still count themselves out of the ranks' metrics.
  const mock_options options;
  std::deque<rank_state> ranks;
  std::vector<std::unique_ptr<asio::io_context>> contexts;
  std::unique_ptr<asio::signal_set> signals;
  std::vector<std::uint16_t> ports;
};

mock_server::mock_server(const mock_options& options) : impl_(std::make_unique<impl>(options)) {
  raise_open_file_limit();
  auto& s = *impl_;
  for (unsigned t = 0; t < options.threads; ++t) {
    // Concurrency hint 1: each context is run by exactly one thread, so Asio can skip its locking.
    s.contexts.push_back(std::make_unique<asio::io_context>(1));
  }
  const auto address = resolve_host(*s.contexts.front(), options.host);

  for (unsigned r = 0; r < options.ranks; ++r) {
    auto& rank = s.ranks.emplace_back(r);
    std::uint16_t port = options.port == 0 ? 0 : static_cast<std::uint16_t>(options.port + r);
    for (unsigned t = 0; t < options.threads; ++t) {
      // Each thread has its own acceptor on the rank's port; the kernel spreads connections among them.
      tcp::acceptor acceptor(*s.contexts[t]);
      const tcp::endpoint endpoint(address, port);
      boost::system::error_code ec;
      acceptor.open(endpoint.protocol(), ec);
      if (!ec) acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
      if (!ec && options.threads > 1) acceptor.set_option(reuse_port(true), ec);
      if (!ec) acceptor.bind(endpoint, ec);
      if (!ec) acceptor.listen(asio::socket_base::max_listen_connections, ec);
      if (ec) {
        throw std::runtime_error("rank " + std::to_string(r) + ": cannot listen on " + options.host + ":" +
                                 std::to_string(port) + ": " + ec.message());
      }
      if (t == 0) {
        port = acceptor.local_endpoint().port();  // the ephemeral port, shared by the other threads
        s.ports.push_back(port);
      }
      asio::co_spawn(*s.contexts[t], accept_loop(std::move(acceptor), s.options, rank), asio::detached);
    }
  }

  // Installed before the ready line is printed, so that a test's SIGTERM can never find the default
  // action (death by signal, not exit 0).
  s.signals = std::make_unique<asio::signal_set>(*s.contexts.front(), SIGINT, SIGTERM);
  s.signals->async_wait([&s](const boost::system::error_code& ec, int) {
    if (!ec) s.stop_all();
  });
}

mock_server::~mock_server() = default;

const std::vector<std::uint16_t>& mock_server::ports() const { return impl_->ports; }

void mock_server::run() {
  auto& s = *impl_;
  auto run_context = [&s](asio::io_context& context) {
    try {
      context.run();
    } catch (const std::exception& e) {
      std::cerr << "dplb-mock-engine: error: event loop failed: " << e.what() << '\n';
      s.stop_all();
    }
  };
  std::vector<std::thread> workers;
  for (std::size_t t = 1; t < s.contexts.size(); ++t)
    workers.emplace_back(run_context, std::ref(*s.contexts[t]));
  run_context(*s.contexts.front());
  s.stop_all();
  for (auto& worker : workers) worker.join();
}

}  // namespace dplb::mock
