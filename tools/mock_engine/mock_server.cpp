#include "mock_server.hpp"

#include <sys/resource.h>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <csignal>
#include <deque>
#include <exception>
#include <iostream>
#include <optional>
#include <stdexcept>
#include <thread>

#include "admin_api.hpp"
#include "connection_registry.hpp"
#include "engine_metrics.hpp"
#include "faults.hpp"
#include "kv_event_publisher.hpp"
#include "kv_transfer.hpp"
#include "rank_state.hpp"
#include "session.hpp"
#include "sim_engine.hpp"

namespace dplb::mock {
namespace {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using reuse_port = asio::detail::socket_option::boolean<SOL_SOCKET, SO_REUSEPORT>;

constexpr auto as_result = asio::as_tuple(asio::use_awaitable);
constexpr std::string_view metrics_type = "text/plain; version=0.0.4; charset=utf-8";
constexpr std::string_view json_type = "application/json";

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

// SO_REUSEADDR always, so that a rank re-opened by the "listening" fault gets its port back while
// connections it closed linger in TIME_WAIT.
boost::system::error_code listen_on(tcp::acceptor& acceptor, const tcp::endpoint& endpoint, bool share_port) {
  boost::system::error_code ec;
  acceptor.open(endpoint.protocol(), ec);
  if (!ec) acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec && share_port) acceptor.set_option(reuse_port(true), ec);
  if (!ec) acceptor.bind(endpoint, ec);
  if (!ec) acceptor.listen(asio::socket_base::max_listen_connections, ec);
  return ec;
}

// Out of descriptors or memory: say so, and pause rather than spin on the ready listener.
asio::awaitable<void> accept_failed(std::string_view who, const boost::system::error_code& ec) {
  std::cerr << "dplb-mock-engine: warning: " << who << " accept failed: " << ec.message() << '\n';
  asio::steady_timer backoff(co_await asio::this_coro::executor, std::chrono::milliseconds(100));
  co_await backoff.async_wait(as_result);
}

// One rank's listener on one event-loop thread, and the connections it accepted. Once run() has begun
// it is touched only by that thread: the admin port posts its changes there.
struct rank_listener {
  rank_listener(rank_state& r, asio::io_context& c) : rank(r), context(c) {}

  rank_state& rank;
  asio::io_context& context;
  std::optional<tcp::acceptor> acceptor;  // empty while the rank is not listening
  // Bumped by every open and close: an accept loop of another generation leaves at its next step.
  std::uint64_t generation = 0;
  connection_registry connections;
};

asio::awaitable<void> accept_loop(rank_listener& listener, std::uint64_t generation,
                                  const mock_options& options) {
  const std::string who = "rank " + listener.rank.label;
  for (;;) {
    auto [ec, socket] = co_await listener.acceptor->async_accept(as_result);
    // Closed (and perhaps re-opened) meanwhile: a connection accepted just before goes with it.
    if (listener.generation != generation || ec == asio::error::operation_aborted) co_return;
    if (ec) {
      co_await accept_failed(who, ec);
      if (listener.generation != generation) co_return;
      continue;
    }
    // Events are small and must leave at once: Nagle would hold one back behind an unacknowledged one.
    boost::system::error_code ignored;
    socket.set_option(tcp::no_delay(true), ignored);
    asio::co_spawn(listener.context,
                   serve_connection(std::move(socket), options, listener.rank, listener.connections),
                   log_session_failure);
  }
}

// Runs on the listener's thread.
boost::system::error_code open_listener(rank_listener& listener, const tcp::endpoint& endpoint,
                                        bool share_port, const mock_options& options) {
  if (listener.acceptor) return {};
  tcp::acceptor acceptor(listener.context);
  if (const auto ec = listen_on(acceptor, endpoint, share_port)) return ec;
  listener.acceptor.emplace(std::move(acceptor));
  asio::co_spawn(listener.context, accept_loop(listener, ++listener.generation, options), asio::detached);
  return {};
}

// Runs on the listener's thread. Closing the acceptor refuses new connections at once (and resets
// those still in its backlog); then every open connection is closed.
void close_listener(rank_listener& listener) {
  ++listener.generation;
  listener.acceptor.reset();  // a pending accept completes with operation_aborted
  listener.connections.close_all();
}

asio::awaitable<void> admin_accept_loop(tcp::acceptor acceptor, admin_handler& admin) {
  for (;;) {
    auto [ec, socket] = co_await acceptor.async_accept(as_result);
    if (ec == asio::error::operation_aborted) co_return;
    if (ec) {
      co_await accept_failed("admin", ec);
      continue;
    }
    asio::co_spawn(acceptor.get_executor(), serve_admin_connection(std::move(socket), admin),
                   log_session_failure);
  }
}

}  // namespace

struct mock_server::impl final : admin_handler {
  explicit impl(const mock_options& o) : options(o) {}

  // Acceptors belong to their io_context and must go before it; the registries and rank states must
  // stay until the contexts have destroyed the coroutines that use them. Contexts go last first, so
  // that an admin change still queued on another thread never outlives the admin thread's context.
  ~impl() {
    if (simulation) simulation->shutdown();  // its timers live on thread 0's context
    for (auto& per_rank : listeners) {
      for (auto& listener : per_rank) listener->acceptor.reset();
    }
    signals.reset();
    keep_running.clear();
    while (!contexts.empty()) contexts.pop_back();
  }

  void stop_all() {
    for (auto& context : contexts) context->stop();
  }

  bool share_ports() const { return options.threads > 1; }

  asio::awaitable<admin_answer> handle(std::string_view method, std::string_view target,
                                       std::string_view body) override;
  asio::awaitable<boost::system::error_code> set_listening(unsigned rank, bool open);

  const mock_options options;
  std::deque<rank_state> ranks;
  // With --kv-events-port: every engine's ZMQ sockets, on a thread of their own. Declared before the
  // simulation, which publishes through it, so that it goes after it.
  std::unique_ptr<kv_event_publisher> kv_publisher;
  // With --simulate. Outlives the contexts: sessions destroyed with them still reach it (to learn that
  // it is shut down).
  std::unique_ptr<sim_engine> simulation;
  // With --kv-role prefill: the blocks held for decode engines. Outlives the contexts, whose expiry
  // timers and sessions use it.
  std::unique_ptr<kv_hold_table> kv_holds;
  std::vector<tcp::endpoint> endpoints;                                // rank i's bound address and port
  std::vector<std::vector<std::unique_ptr<rank_listener>>> listeners;  // [rank][thread]
  std::vector<std::unique_ptr<asio::io_context>> contexts;             // [thread]; 0 runs the admin port
  // A thread whose acceptors are all closed by the "listening" fault may have nothing left to do, yet
  // must stay to re-open them: its context runs until stop_all().
  std::vector<asio::executor_work_guard<asio::io_context::executor_type>> keep_running;
  std::unique_ptr<asio::signal_set> signals;
  std::vector<std::uint16_t> ports;
  std::uint16_t admin_port = 0;
};

// Runs on thread 0, like every admin request, so that changes apply in the order they arrive.
asio::awaitable<admin_answer> mock_server::impl::handle(std::string_view method, std::string_view target,
                                                        std::string_view body) {
  auto parsed = parse_admin_request(method, target, body, static_cast<unsigned>(ranks.size()), options.dp);
  if (auto* answer = std::get_if<admin_answer>(&parsed)) co_return std::move(*answer);
  auto& command = std::get<admin_command>(parsed);
  auto& rank = ranks[command.rank];
  auto& engine = rank.engines[command.engine];
  switch (command.action) {
    case admin_action::get_metrics:
      co_return admin_answer{200, metrics_type, port_metrics_text(rank, options.model)};
    case admin_action::get_fault:
      co_return admin_answer{200, json_type, render_fault_settings(rank.faults.load())};
    case admin_action::get_override:
      co_return admin_answer{200, json_type, render_gauge_overrides(engine.overrides.load())};
    case admin_action::set_override: {
      gauge_overrides after;
      engine.overrides.update([&](gauge_overrides& o) { after = o = patched(o, command.override_patch); });
      co_return admin_answer{200, json_type, render_gauge_overrides(after)};
    }
    case admin_action::clear_overrides:
      for (auto& each_rank : ranks) {
        for (auto& each_engine : each_rank.engines) each_engine.overrides.store({});
      }
      co_return admin_answer{200, json_type, render_gauge_overrides({})};
    case admin_action::set_raw_metrics:
      rank.raw_metrics.store(std::move(command.raw_metrics));
      co_return admin_answer{200, json_type, "{}"};
    case admin_action::clear_raw_metrics:
      rank.raw_metrics.store(std::nullopt);
      co_return admin_answer{200, json_type, "{}"};
    case admin_action::get_stats:
      co_return admin_answer{200, json_type, render_stats(ranks, ports)};
    case admin_action::publish_kv_event: {
      if (!kv_publisher) co_return admin_failure(400, "no KV-cache events: the mock runs without --kv-events-port");
      const auto seq = kv_publisher->publish(engine.sim_index, std::move(command.payload), 0, command.seq);
      co_return admin_answer{200, json_type, "{\"seq\":" + std::to_string(seq) + "}"};
    }
    case admin_action::reset_kv_cache:
      if (!simulation) co_return admin_failure(400, "no KV cache to reset: the mock runs without --simulate");
      // Thread 0, where the simulation lives: the reset and its AllBlocksCleared happen between steps.
      for (const auto& each : rank.engines) {
        if (command.all_engines || each.index == command.engine) simulation->reset_prefix_cache(each.sim_index);
      }
      co_return admin_answer{200, json_type, "{}"};
    case admin_action::set_fault:
    case admin_action::clear_fault:
      break;
  }

  const auto before = rank.faults.load();
  auto after =
      command.action == admin_action::clear_fault ? fault_settings{} : patched(before, command.patch);
  rank.faults.store(after);
  if (after.listening != before.listening) {
    if (const auto ec = co_await set_listening(command.rank, after.listening)) {
      // Some thread could not bind again (the port was taken meanwhile): leave the rank closed on every
      // thread, as the state will say.
      co_await set_listening(command.rank, false);
      auto now = rank.faults.load();
      now.listening = false;
      rank.faults.store(now);
      co_return admin_failure(500, "rank " + rank.label + ": cannot listen again on " + options.host + ":" +
                                       std::to_string(ports[command.rank]) + ": " + ec.message());
    }
  }
  co_return admin_answer{200, json_type, render_fault_settings(after)};
}

// Opens or closes a rank on every thread, each on its own thread, and completes once all are done, so
// that the admin's answer means "refused from now on" or "accepted from now on".
asio::awaitable<boost::system::error_code> mock_server::impl::set_listening(unsigned rank, bool open) {
  struct countdown {
    countdown(const asio::any_io_executor& executor, std::size_t n)
        : done(executor, std::chrono::steady_clock::time_point::max()), left(n) {}
    asio::steady_timer done;  // cancelled by the last thread to report
    std::size_t left;
    boost::system::error_code error;  // the first failure
  };
  // Only this thread touches the countdown: each thread reports by posting back here, and each report
  // carries the shared pointer along so that the last owner is always this thread.
  const auto admin_executor = co_await asio::this_coro::executor;
  auto state = std::make_shared<countdown>(admin_executor, listeners[rank].size());
  for (auto& listener : listeners[rank]) {
    asio::post(listener->context,
               [this, rank, open, &l = *listener, admin_executor, report = state]() mutable {
                 boost::system::error_code ec;
                 if (open) {
                   ec = open_listener(l, endpoints[rank], share_ports(), options);
                 } else {
                   close_listener(l);
                 }
                 asio::post(admin_executor, [state = std::move(report), ec] {
                   if (ec && !state->error) state->error = ec;
                   if (--state->left == 0) state->done.cancel();
                 });
               });
  }
  co_await state->done.async_wait(as_result);
  co_return state->error;
}

mock_server::mock_server(const mock_options& options) : impl_(std::make_unique<impl>(options)) {
  raise_open_file_limit();
  auto& s = *impl_;
  for (unsigned t = 0; t < options.threads; ++t) {
    // Concurrency hint 1: each context is run by exactly one thread, so Asio can skip its locking.
    s.contexts.push_back(std::make_unique<asio::io_context>(1));
    s.keep_running.push_back(asio::make_work_guard(*s.contexts.back()));
  }
  const auto address = resolve_host(*s.contexts.front(), options.host);

  for (unsigned r = 0; r < options.ranks; ++r) {
    auto& rank = s.ranks.emplace_back(r, options.dp, r * options.dp);
    auto& per_thread = s.listeners.emplace_back();
    tcp::endpoint endpoint(address, options.port == 0 ? 0 : static_cast<std::uint16_t>(options.port + r));
    for (unsigned t = 0; t < options.threads; ++t) {
      // Each thread has its own acceptor on the rank's port; the kernel spreads connections among them.
      auto& listener = *per_thread.emplace_back(std::make_unique<rank_listener>(rank, *s.contexts[t]));
      if (const auto ec = open_listener(listener, endpoint, s.share_ports(), s.options)) {
        throw std::runtime_error("rank " + std::to_string(r) + ": cannot listen on " + options.host + ":" +
                                 std::to_string(endpoint.port()) + ": " + ec.message());
      }
      if (t == 0) {
        endpoint.port(listener.acceptor->local_endpoint().port());  // the ephemeral one, for the others
        s.ports.push_back(endpoint.port());
        s.endpoints.push_back(endpoint);
      }
    }
  }

  if (options.role != kv_role::both) {
    if (options.role == kv_role::prefill) s.kv_holds = std::make_unique<kv_hold_table>(options.kv_hold_timeout);
    for (auto& rank : s.ranks) {
      rank.kv_holds = s.kv_holds.get();
      for (auto& engine : rank.engines) engine.metrics.kv_transfer = true;
    }
  }

  if (options.simulate) {
    // Every engine of every port is a scheduler of its own, numbered by sim_index.
    std::vector<engine_metrics*> engines;
    for (auto& rank : s.ranks) {
      for (auto& engine : rank.engines) engines.push_back(&engine.metrics);
    }
    s.simulation = std::make_unique<sim_engine>(*s.contexts.front(), options, std::move(engines));
    for (auto& rank : s.ranks) {
      for (auto& engine : rank.engines) engine.simulation = s.simulation.get();
    }
    if (options.kv_events_port != 0) {
      kv_publisher_config config;
      config.address = address.to_string();
      config.ipv6 = address.is_v6();
      config.events_port = options.kv_events_port;
      config.replay_port = options.kv_replay_port;
      config.topic = options.kv_events_topic;
      config.buffer_steps = options.kv_buffer_steps;
      std::vector<engine_metrics*> metrics;
      for (auto& rank : s.ranks) {
        for (auto& engine : rank.engines) {
          engine.metrics.kv_events = true;
          metrics.push_back(&engine.metrics);
        }
      }
      s.kv_publisher = std::make_unique<kv_event_publisher>(config, std::move(metrics));
      s.simulation->publish_kv_events(
          *s.kv_publisher,
          kv_event_format{options.kv_events_encoding, options.kv_events_int_hashes, options.engine.kv.block_size},
          options.dp);
    }
  }

  tcp::acceptor admin(*s.contexts.front());
  const tcp::endpoint admin_endpoint(address, options.admin_port);
  if (const auto ec = listen_on(admin, admin_endpoint, false)) {
    throw std::runtime_error("admin: cannot listen on " + options.host + ":" +
                             std::to_string(options.admin_port) + ": " + ec.message());
  }
  s.admin_port = admin.local_endpoint().port();
  asio::co_spawn(*s.contexts.front(), admin_accept_loop(std::move(admin), s), asio::detached);

  // Installed before the ready line is printed, so that a test's SIGTERM can never find the default
  // action (death by signal, not exit 0).
  s.signals = std::make_unique<asio::signal_set>(*s.contexts.front(), SIGINT, SIGTERM);
  s.signals->async_wait([&s](const boost::system::error_code& ec, int) {
    if (!ec) s.stop_all();
  });
}

mock_server::~mock_server() = default;

const std::vector<std::uint16_t>& mock_server::ports() const { return impl_->ports; }

std::uint16_t mock_server::admin_port() const { return impl_->admin_port; }

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
