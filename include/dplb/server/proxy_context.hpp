#pragma once
// What every session needs, bundled: the shared state (read-only configuration, the one balancer,
// the metrics) and the state of the worker thread the session runs on (its connection pool).

#include <atomic>
#include <unordered_set>
#include <vector>

#include "dplb/balancer/balancer.hpp"
#include "dplb/config/settings.hpp"
#include "dplb/metrics/proxy_metrics.hpp"
#include "dplb/server/deadline_sweeper.hpp"
#include "dplb/upstream/backend.hpp"
#include "dplb/upstream/connection_pool.hpp"
#include "dplb/upstream/health_monitor.hpp"
#include "dplb/support/io_types.hpp"

namespace dplb::server {

// Shared by every thread; outlives every worker.
struct shared_state {
  const config::settings& settings;
  const std::vector<upstream::backend>& backends;
  balancer::balancer& balancer;
  metrics::proxy_metrics& metrics;
  upstream::health_monitor& health;
  std::atomic<std::size_t> client_connections{0};  // open now, all workers
  std::atomic<bool> draining{false};               // SIGTERM received: finish what is in flight, take nothing new
};

// One per worker thread; only that thread touches it.
struct worker_state {
  shared_state& shared;
  upstream::connection_pool& pool;
  deadline_sweeper& deadlines;  // of every socket of the worker's sessions
  // Client connections waiting for their next request; a drain closes them at once.
  std::unordered_set<io::tcp_stream*> idle_clients;
};

}  // namespace dplb::server
