#include "dplb/app/application.hpp"

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/address.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <algorithm>
#include <cstdlib>
#include <malloc.h>
#include <optional>
#include <string_view>
#include <stdexcept>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>
#include <sys/resource.h>
#include <thread>

#include "dplb/admin/admin_listener.hpp"
#include "dplb/app/memory_trimmer.hpp"
#include "dplb/app/version.hpp"
#include "dplb/config/admin_token.hpp"
#include "dplb/upstream/backend_registry.hpp"
#include "dplb/upstream/engine_stats_poller.hpp"
#include "dplb/upstream/model_context.hpp"
#include "dplb/upstream/kv_event_feed.hpp"
#include "configured_parts.hpp"
#include "dplb/server/listener.hpp"
#include "dplb/support/supervisor.hpp"
#include "dplb/support/io_buffers.hpp"

namespace dplb::app {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;

void configure_logging(const config::settings& settings) {
  auto logger = spdlog::stderr_logger_mt("dplb");
  if (settings.log_fmt == config::log_format::json) {
    // Messages are written by dplb itself and contain no quotes or control characters.
    logger->set_pattern(R"({"time":"%Y-%m-%dT%H:%M:%S.%e%z","level":"%l","logger":"%n","msg":"%v"})");
  } else {
    logger->set_pattern("%Y-%m-%dT%H:%M:%S.%e%z %l %n: %v");
  }
  logger->set_level(spdlog::level::from_str(settings.log_level));
  logger->flush_on(spdlog::level::info);
  spdlog::set_default_logger(std::move(logger));
}

namespace {

tcp::endpoint listen_endpoint(const config::listen_address& listen) {
  boost::system::error_code ec;
  auto address = asio::ip::make_address(listen.host, ec);
  if (!ec) return {address, listen.port};
  asio::io_context io;
  tcp::resolver resolver(io);
  auto results = resolver.resolve(listen.host, std::to_string(listen.port), ec);
  if (ec || results.empty()) {
    throw config::config_error("cannot resolve listen host '" + listen.host + "': " + ec.message());
  }
  return results.begin()->endpoint();
}

std::string format_endpoint(const tcp::endpoint& endpoint) {
  const auto address = endpoint.address();
  return (address.is_v6() ? "[" + address.to_string() + "]" : address.to_string()) + ":" +
         std::to_string(endpoint.port());
}

// Every client connection and every upstream connection is a descriptor; the common soft limit of 1024
// would cap dplb near 500 concurrent streams. Raise it to the hard limit, as nginx's
// worker_rlimit_nofile does, and report what we got.
rlim_t raise_open_file_limit() {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0) return 0;
  if (limit.rlim_cur < limit.rlim_max) {
    rlimit raised{limit.rlim_max, limit.rlim_max};
    if (setrlimit(RLIMIT_NOFILE, &raised) == 0) return raised.rlim_cur;
  }
  return limit.rlim_cur;
}

unsigned thread_count(unsigned configured) {
  if (configured > 0) return configured;
  return std::max(1u, std::thread::hardware_concurrency());
}

// One event loop with its own acceptor and connection pool: nothing in it is shared with other
// workers, so none of it needs a lock. Every socket and timer of a worker is only ever touched on the
// worker's own thread (other threads only post to it), so the reactor's per-socket locking is switched
// off (BOOST_ASIO_CONCURRENCY_HINT_UNSAFE_IO); the scheduler keeps its lock for those posts.
struct worker {
  worker(server::shared_state& shared, const upstream::topology& topology, upstream::pool_limits limits,
         const tcp::endpoint& endpoint)
      : pool(io.get_executor(), topology, limits),
        deadlines(io.get_executor(), server::deadline_sweeper::period_for(shared.settings)),
        state{shared, pool, deadlines, {}},
        acceptor(server::open_acceptor(io.get_executor(), endpoint)) {}

  asio::io_context io{BOOST_ASIO_CONCURRENCY_HINT_UNSAFE_IO};
  upstream::connection_pool pool;
  server::deadline_sweeper deadlines;
  server::worker_state state;
  io::acceptor acceptor;
  std::thread thread;
};

// Runs an event loop until it stops. An exception escaping a handler must not take every other connection
// or task of the loop down with it: it is logged and the loop goes on (what it came from is gone with its
// handler; the long-lived tasks are supervised on their own).
void run_event_loop(asio::io_context& io, std::string_view where) {
  for (;;) {
    try {
      io.run();
      return;
    } catch (const std::exception& e) {
      spdlog::error("unexpected exception in {}: {}", where, e.what());
    }
  }
}

// dplb's side channels to the engines, the health checks and the engine-stats reads, run on a thread and
// event loop of their own: a probe that waits out its timeout, or the parse of a 16 MiB /metrics page,
// never holds up a request worker's loop (with --threads 1, the only one). What they touch besides their
// own sockets and timers (balancer, metrics, health monitor) is thread-safe by contract.
struct side_channel_thread {
  asio::io_context io{1};
  std::thread thread;

  void start() {
    thread = std::thread([this] { run_event_loop(io, "the health-check and engine-stats thread"); });
  }
  void stop() {
    io.stop();
    if (thread.joinable()) thread.join();
  }
  ~side_channel_thread() { stop(); }
};

// The test hook DPLB_TEST_THROW_ONCE (docs/operations.md): each task it names throws once, to show that it is
// logged, counted and restarted. Read once, before any task starts.
void arm_test_faults() {
  const char* names = std::getenv("DPLB_TEST_THROW_ONCE");
  if (names == nullptr || *names == '\0') return;
  try {
    support::arm_faults(names);
  } catch (const std::invalid_argument& e) {
    throw config::config_error(std::string("DPLB_TEST_THROW_ONCE: ") + e.what());
  }
  spdlog::warn("test hook DPLB_TEST_THROW_ONCE={}: each of these tasks throws once; not for production", names);
}

// The admin token's file should be its owner's alone: say so at start and on each SIGHUP, but serve.
void warn_if_token_file_exposed(const config::settings& s) {
  if (!s.admin_token_file) return;
  if (const auto why = config::admin_token_file_exposure(*s.admin_token_file); !why.empty()) spdlog::warn("{}", why);
}

}  // namespace

struct application::impl {
  impl(config::settings s, application::backend_source reload)
      : settings(std::move(s)),
        reload_backends(std::move(reload)),
        topology_storage(configured_topology(settings.backends)),
        topology(*topology_storage),
        routing(topology.capacity()),
        kv_index(kv_event_index(settings, topology.capacity())),
        balancer(rank_clusters(topology), cluster_policies(settings, &routing, kv_index.get()),
                 balancer::queue_limits{settings.max_inflight_per_rank, settings.max_queued_requests,
                                       settings.queue_timeout / 2, settings.long_prompt_tokens},
                 balancer::rank_timing{settings.slow_start, stats_max_age(settings)}, topology.capacity()),
        metrics({}, balancer, settings.policy, topology.capacity()),
        health(topology, balancer, metrics,
               upstream::health_check_settings{
                   settings.health_check_interval, settings.health_check_timeout, "/health",
                   upstream::health_policy{settings.unhealthy_threshold, settings.healthy_threshold,
                                           settings.ejection_threshold, settings.ejection_base,
                                           settings.ejection_max, settings.max_ejected_percent}}),
        // A backend that does not answer must not hold the others' numbers back by much more than an interval.
        stats_interval(config::engine_stats_interval(settings, uses_engine_stats(settings))),
        stats(topology, balancer, stats_interval,
              std::min(settings.health_check_timeout, std::max(stats_interval, std::chrono::milliseconds(50)))),
        model_context(topology, settings.health_check_timeout, model_context_refresh),
        registry(topology, balancer, metrics, health, cluster_names(settings), upstream::resolve_backend,
                 cluster_roles(settings)),
        models(settings),
        tenants(configured_tenants(settings)),
        shared{settings, topology, balancer, metrics, health, models, *tenants},
        signals(signal_io, SIGINT, SIGTERM),
        reload_signal(signal_io, SIGHUP) {
    arm_test_faults();
    metrics.observe_internal_errors(supervisor);
    metrics.observe_tenants(*tenants);
    if (!settings.access_log.empty()) {
      try {
        access_log = std::make_unique<metrics::access_log>(settings.access_log, supervisor);
      } catch (const std::runtime_error& e) {
        throw config::config_error(std::string(e.what()) + " (--access-log)");
      }
      shared.access_log = access_log.get();
      metrics.observe_access_log(*access_log);
    }
    shared.model_context = &model_context;
    if (kv_index) {
      kv_subscriber = std::make_unique<kv::event_subscriber>(
          *kv_index, kv::subscriber_options{},
          [this](const std::function<void()>& body, const std::function<bool(std::chrono::milliseconds)>& pause) {
            supervisor.run_thread(
                support::task::kv_events,
                [&body] {
                  support::fault_point(support::task::kv_events);  // the test hook, before a run's first poll
                  body();
                },
                pause);
          });
      kv_feed = std::make_unique<upstream::kv_event_feed>(topology, balancer, *kv_index, *kv_subscriber);
      kv_feed->refresh();  // the ranks' event series are in the metrics from the first scrape
      shared.kv_events = kv_index.get();
      registry.observe_kv_events(kv_index.get());
      metrics.observe_kv_events(*kv_index, settings.tokenize == config::tokenize_mode::engine);
    }
    if (settings.shared_state) {
      ledger = std::make_unique<balancer::replica_ledger>(balancer, shared_ledger_options(settings));
      metrics.observe_shared_state(*ledger);
    }
    if (!settings.affinity_header.empty()) balancer.enable_affinity(settings.load_bound, &routing);
    metrics.observe_routing(routing, config::any_cluster_uses(settings, "prefix-aware"),
                            !settings.affinity_header.empty());
    for (const auto& h : topology.ranks()) {
      balancer.set_weight(h.rank, h.weight);
      // As the backend registry adds a rank at run time. Before any worker runs: no scrape can miss it.
      metrics.add_rank(topology.backends()[h.backend].url, settings.clusters.at(h.cluster).name, h.role);
    }
    if (config::any_cluster_disaggregated(settings)) metrics.observe_disaggregation();
    const upstream::pool_limits limits{settings.upstream_connect_timeout, settings.upstream_idle_timeout,
                                       settings.upstream_max_idle_per_rank};
    auto endpoint = listen_endpoint(settings.listen);
    const unsigned threads = thread_count(settings.threads);
    for (unsigned i = 0; i < threads; ++i) {
      workers.push_back(std::make_unique<worker>(shared, topology, limits, endpoint));
      // With port 0 the first acceptor picks the port; the others must join that same port.
      if (i == 0) endpoint = workers.front()->acceptor.local_endpoint();
    }
    bound = endpoint;
    if (settings.admin_listen) {
      admin.emplace(registry, settings.admin_token, settings.default_cluster);
      admin->serve_tenants(*tenants, [this]() -> std::string {
        if (!reload_backends) return "this dplb has no configuration to reload";
        try {
          return apply_tenants(reload_backends(), "admin API");
        } catch (const std::exception& e) {
          return e.what();
        }
      });
      if (ledger) admin->show_shared_state(*ledger);
      admin_acceptor.emplace(admin::open_acceptor(signal_io.get_executor(), listen_endpoint(*settings.admin_listen)));
      admin_bound = admin_acceptor->local_endpoint();
    }
  }

  // The tenants of a configuration read again (SIGHUP, the admin API), applied whole or not at all: what
  // kept them from being applied, or "". Queued requests keep their places: they hold their tenant's state,
  // which a reload keeps by name.
  std::string apply_tenants(const config::settings& fresh, std::string_view by) {
    // require_api_key changes only with a restart: a list left without keys would refuse every request.
    const bool any_key = std::ranges::any_of(fresh.tenants, [](const tenants::tenant_spec& t) {
      return !t.api_keys.empty() || !t.api_key_sha256.empty();
    });
    if (settings.require_api_key && !any_key) {
      const std::string why = "require_api_key is on (it changes only with a restart) and no tenant has a key left";
      spdlog::error("{}: tenants not reloaded: {}; keep a key, or restart without require_api_key", by, why);
      return why;
    }
    try {
      tenants->reload(fresh.tenants);
    } catch (const std::exception& e) {
      spdlog::error("{}: tenants not reloaded: {}; fix the configuration and reload again", by, e.what());
      return e.what();
    }
    spdlog::info("{}: tenants reloaded ({} configured)", by, fresh.tenants.size());
    if (fresh.require_api_key != settings.require_api_key || fresh.tenant_header != settings.tenant_header ||
        fresh.fair_by != settings.fair_by || fresh.max_queue_wait != settings.max_queue_wait) {
      spdlog::warn("{}: require_api_key, tenant_header, fair_by and max_queue_wait_ms change only with a restart", by);
    }
    return {};
  }

  config::settings settings;
  application::backend_source reload_backends;
  // Restarts the background tasks that fail; outlives them all (the access log's thread, every event loop).
  support::supervisor supervisor;
  std::unique_ptr<upstream::topology> topology_storage;  // not movable: its counts are atomics
  upstream::topology& topology;
  balancer::routing_stats routing;  // prefix and affinity decisions, read by the metrics
  // What the engines' KV-cache events say each rank holds (null when nothing reads them): before the
  // balancer, whose prefix-aware policies match against it.
  std::unique_ptr<kv::event_index> kv_index;
  balancer::balancer balancer;
  metrics::proxy_metrics metrics;
  upstream::health_monitor health;
  std::chrono::milliseconds stats_interval;  // 0: the engines' /metrics are never read
  upstream::engine_stats_poller stats;
  // The engines' models' max_model_len, read on first need (a token budget's request without max_tokens).
  static constexpr std::chrono::milliseconds model_context_refresh{60'000};
  upstream::model_context model_context;
  side_channel_thread side_channels;  // runs health, stats and the models' contexts: stopped before them
  upstream::backend_registry registry;  // the main thread's: admin API, SIGHUP, retirements
  server::model_routes models;
  std::unique_ptr<tenants::tenant_book> tenants;  // SIGHUP and the admin API reload it
  std::unique_ptr<metrics::access_log> access_log;  // outlives the workers that write to it
  server::shared_state shared;
  std::unique_ptr<kv::event_subscriber> kv_subscriber;  // with kv_index: reads the events into it
  std::unique_ptr<upstream::kv_event_feed> kv_feed;     // keeps its sources in step with the backends
  // --shared-state: the ledger shared with the other replicas. Hears the balancer's releases, so it outlives
  // the workers (their sessions release their leases as they go); stopped once they have.
  std::unique_ptr<balancer::replica_ledger> ledger;
  std::vector<std::unique_ptr<worker>> workers;
  asio::io_context signal_io;  // the main thread's loop: signals and housekeeping
  asio::signal_set signals;
  asio::signal_set reload_signal;
  asio::steady_timer housekeeping{signal_io};
  asio::steady_timer retirements{signal_io};
  memory_trimmer trimmer;
  tcp::endpoint bound;
  // The admin API runs on the main thread's loop, not on a worker's: an admin request (a JSON document
  // over every rank) then never delays a proxied request's I/O, and the main loop is idle but for signals
  // and housekeeping. Everything it touches (balancer, metrics) is thread-safe.
  std::optional<admin::admin_api> admin;
  std::optional<io::acceptor> admin_acceptor;  // after signal_io: closed before the loop is destroyed
  tcp::endpoint admin_bound;
};

application::application(config::settings settings, backend_source reload)
    : impl_(std::make_unique<impl>(std::move(settings), std::move(reload))) {}

application::~application() = default;

std::string application::listen_address() const { return format_endpoint(impl_->bound); }

void application::stop() {
  asio::post(impl_->signal_io, [this] { impl_->signal_io.stop(); });
}

void application::schedule_housekeeping() {
  auto& s = *impl_;
  s.housekeeping.expires_after(std::chrono::seconds(1));
  s.housekeeping.async_wait([this, &s](const boost::system::error_code& ec) {
    if (ec) return;
    if (s.trimmer.observe(s.shared.client_connections.load(std::memory_order_relaxed), io::buffer_bytes())) {
      // Each worker first gives back the handler and frame memory Asio keeps for it (scattered blocks that
      // would keep pages from going back); the last one hands the trim to the main thread, off every
      // worker's event loop.
      auto pending = std::make_shared<std::atomic<std::size_t>>(s.workers.size());
      for (auto& w : s.workers) {
        asio::post(w->io, [&s, pending] {
          io::release_recycled_memory();
          if (pending->fetch_sub(1) != 1) return;
          asio::post(s.signal_io, [] {
            const auto started = std::chrono::steady_clock::now();
            malloc_trim(0);
            spdlog::debug("returned freed memory to the system after a surge ({} us)",
                          std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - started)
                              .count());
          });
        });
      }
    }
    schedule_housekeeping();
  });
}

void application::schedule_retirements() {
  auto& s = *impl_;
  s.retirements.expires_after(std::chrono::milliseconds(200));
  s.retirements.async_wait([this, &s](const boost::system::error_code& ec) {
    if (ec) return;
    try {
      s.registry.retire_drained();
      if (s.kv_feed) s.kv_feed->refresh();
    } catch (const std::exception& e) {  // nothing may escape the main loop: run() must reach its shutdown
      spdlog::error("retiring removed backends or refreshing the KV-event sources failed: {}", e.what());
    }
    schedule_retirements();
  });
}

void application::await_reload_signal() {
  auto& s = *impl_;
  s.reload_signal.async_wait([this, &s](const boost::system::error_code& ec, int) {
    if (ec) return;
    if (s.access_log) {
      try {
        s.access_log->reopen();
        spdlog::info("SIGHUP: access log reopened at {}", s.settings.access_log);
      } catch (const std::exception& e) {
        spdlog::error("SIGHUP: cannot reopen the access log {}: {}", s.settings.access_log, e.what());
      }
    }
    // Only the backends, the tenants and the admin token are applied: every other setting needs a restart. A configuration
    // that cannot be read again (a broken file, the token's file gone) changes nothing.
    std::optional<config::settings> fresh;
    if (!s.reload_backends) {
      spdlog::warn("SIGHUP ignored: this dplb has no configuration to reload");
    } else {
      try {
        fresh = s.reload_backends();
      } catch (const std::exception& e) {
        spdlog::error("SIGHUP: backends not (fully) reloaded and the admin token kept: {}; fix the configuration "
                      "and send SIGHUP again", e.what());
      }
    }
    if (fresh && s.admin && !fresh->admin_token.empty()) {
      try {  // nothing may escape the main loop: run() must reach its shutdown
        s.admin->set_token(fresh->admin_token);
        if (fresh->admin_token_file) spdlog::info("SIGHUP: admin token read again from {}", *fresh->admin_token_file);
      } catch (const std::exception& e) {
        spdlog::error("SIGHUP: the admin token kept: its digest failed: {}", e.what());
      }
      warn_if_token_file_exposed(*fresh);
    }
    if (fresh) s.apply_tenants(*fresh, "SIGHUP");
    if (fresh) {
      try {
        const auto summary = s.registry.reload(backends_for_reload(s.settings, *fresh));
        spdlog::info("SIGHUP: backends reloaded: {} added, {} removed, {} reweighted", summary.added.size(),
                     summary.removed.size(), summary.reweighted.size());
        if (s.ledger && (!summary.added.empty() || !summary.removed.empty())) {
          // The ledger's keys and rank numbers are those of the backend list this replica started with.
          spdlog::warn("SIGHUP: backends added or removed while --shared-state shares a ledger: replicas agree on "
                       "rank numbers only with the same backend list; give every replica the new list and restart "
                       "them one by one (each restarted replica joins the ledger of the new list)");
        }
      } catch (const std::exception& e) {
        spdlog::error("SIGHUP: backends not (fully) reloaded: {}; fix the configuration and send SIGHUP again",
                      e.what());
      }
    }
    await_reload_signal();
  });
}

void application::drain() {
  auto& s = *impl_;
  if (s.admin_acceptor) {
    // The main loop has stopped: no admin request is served during the drain, so refuse new ones at once.
    boost::system::error_code ignored;
    s.admin_acceptor->close(ignored);
  }
  // Stop taking connections, close the ones waiting for a request, and let requests in flight finish;
  // a connection whose request finishes during the drain is closed after its response.
  s.shared.draining.store(true);
  for (auto& w : s.workers) {
    asio::post(w->io, [&w = *w] {
      boost::system::error_code ignored;
      w.acceptor.close(ignored);
      w.state.idle_clients.for_each([&](io::tcp_stream& client) { client.socket().cancel(ignored); });
    });
  }
  const auto deadline = std::chrono::steady_clock::now() + s.settings.drain_timeout;
  std::size_t open = 0;
  while ((open = s.shared.client_connections.load()) > 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // the main thread has nothing else to do
  }
  if (open > 0) {
    spdlog::warn("drain timeout ({} ms) reached with {} client connections still open; closing them",
                 s.settings.drain_timeout.count(), open);
  } else {
    spdlog::info("drained: every in-flight request finished");
  }
}

int application::run() {
  auto& s = *impl_;
  std::string backend_list;
  for (const auto& h : s.topology.ranks()) {
    backend_list += (backend_list.empty() ? "" : ",") + ("[" + std::to_string(h.rank) + "]" + h.name);
    if (h.weight != 1) backend_list += " weight " + std::to_string(h.weight);
  }
  const auto open_files = raise_open_file_limit();
  spdlog::info("dplb {} listening on {} policy={} threads={} backends={} max_open_files={}", version(),
               listen_address(), s.settings.policy, s.workers.size(), backend_list, open_files);

  if (s.models.by_model() || config::any_cluster_disaggregated(s.settings)) {
    for (std::size_t c = 0; c < s.settings.clusters.size(); ++c) {
      const auto& cluster = s.settings.clusters[c];
      std::string ranks;
      for (const auto& h : s.topology.ranks()) {
        if (h.cluster == c) ranks += (ranks.empty() ? "" : ",") + std::to_string(h.rank);
      }
      std::string models;
      for (const auto& m : cluster.models) models += (models.empty() ? "" : ",") + m;
      spdlog::info("cluster {}{}{}: policy={} ranks={} models={}", cluster.name,
                   cluster.role == config::rank_role::both ? "" : " " + std::string(config::role_name(cluster.role)),
                   c == s.settings.default_cluster ? " (default)" : "", cluster.policy, ranks, models);
    }
  }
  if (s.ledger) {
    // Before the workers: their first picks may go through it (once it is up).
    s.ledger->start();
    s.balancer.set_release_listener(s.ledger.get());
    s.shared.ledger = s.ledger.get();
    spdlog::info("shared state: {} as replica {} (--shared-state-timeout-ms {})",
                 ledger::shown_endpoint(*s.settings.shared_state), s.ledger->replica_name(),
                 s.settings.shared_state_timeout.count());
  }
  // Before the workers, which ask it (its executor is set here; its loop runs once the side channels do).
  s.model_context.start(s.side_channels.io.get_executor(), s.supervisor);
  if (s.admin) {
    spdlog::info("admin API listening on {}", format_endpoint(s.admin_bound));
    warn_if_token_file_exposed(s.settings);
    support::supervise(s.supervisor, support::task::admin_accept, s.signal_io.get_executor(),
                       [&s] { return admin::accept_loop(*s.admin, *s.admin_acceptor); });
  }
  for (auto& w : s.workers) {
    support::supervise(s.supervisor, support::task::accept, w->io.get_executor(),
                       [&w = *w] { return server::accept_loop(w.state, w.acceptor); });
    support::supervise(s.supervisor, support::task::pool_sweep, w->io.get_executor(),
                       [&w = *w] { return w.pool.sweep_loop(); });
    asio::post(w->io, [&w = *w] { w.deadlines.start(); });
    w->thread = std::thread([&io = w->io] { run_event_loop(io, "a worker"); });
  }
  s.health.start(s.side_channels.io.get_executor(), s.supervisor);
  if (s.stats_interval.count() > 0) {
    spdlog::info("reading every backend's /metrics each {} ms (--stats-interval)", s.stats_interval.count());
    s.stats.start(s.side_channels.io.get_executor(), s.supervisor);
  } else if (uses_engine_stats(s.settings)) {
    spdlog::warn("a policy that reads engine stats is configured, but --stats-interval is 0: it goes by dplb's "
                 "own counts alone");
  }
  s.side_channels.start();
  if (s.kv_feed) {
    s.kv_subscriber->start();
    if (config::any_backend_has_kv_events(s.settings) && !config::any_cluster_uses(s.settings, "prefix-aware") &&
        !(config::any_cluster_disaggregated(s.settings) && s.settings.pd_skip_prefill_ratio > 0)) {
      spdlog::warn("backends publish KV-cache events (#kv-events=) but no cluster uses --policy prefix-aware: "
                   "dplb indexes them (dplb_kv_blocks) and routes without them");
    }
  }
  if (s.settings.pd_skip_prefill_ratio > 0 &&
      !std::ranges::any_of(s.settings.backends, [](const config::backend_spec& b) {
        return b.role == config::rank_role::decode && b.kv_events;
      })) {
    spdlog::warn("--pd-skip-prefill-ratio is set but no --decode backend publishes KV-cache events (#kv-events=): "
                 "every request runs both legs");
  }
  if (s.balancer.active_policy().name() == "engine-stats") {
    spdlog::info("policy engine-stats is a baseline for benchmarks, not for serving (see docs/benchmarks.md)");
  }

  s.signals.async_wait([&](const boost::system::error_code& ec, int signal_number) {
    if (!ec) spdlog::info("received signal {}; shutting down", signal_number);
    s.signal_io.stop();
  });
  schedule_housekeeping();
  schedule_retirements();
  await_reload_signal();
  s.signal_io.run();

  drain();
  if (s.kv_subscriber) s.kv_subscriber->stop();
  s.health.stop();
  s.stats.stop();
  s.model_context.stop();
  s.side_channels.stop();
  s.model_context.loop_stopped();
  for (auto& w : s.workers) {
    asio::post(w->io, [&w = *w] {
      w.pool.stop();
      w.deadlines.stop();
      w.io.stop();
    });
  }
  for (auto& w : s.workers) w->thread.join();
  if (s.ledger) s.ledger->stop();  // it posts picks' answers to the workers' loops: stopped before they go
  // After a drain timeout, sessions are still queued for a slot and others still hold one. Destroying the
  // workers (below, with impl) destroys those sessions, and every lease among them is released then: a
  // release that served a queued waiter would post its lease to that waiter's worker, whose io_context
  // may already be destroyed (workers go one by one). Closing the queue first makes every later release
  // a plain decrement; nothing can queue again, since every worker thread has stopped.
  s.balancer.close();
  spdlog::info("dplb stopped");
  return 0;
}

}  // namespace dplb::app
