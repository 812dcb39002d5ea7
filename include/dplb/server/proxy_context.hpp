#pragma once
// What every session needs, bundled: the shared state (read-only configuration, the one balancer,
// the metrics) and the state of the worker thread the session runs on (its connection pool).

#include <vector>

#include "dplb/balancer/balancer.hpp"
#include "dplb/config/settings.hpp"
#include "dplb/metrics/proxy_metrics.hpp"
#include "dplb/upstream/backend.hpp"
#include "dplb/upstream/connection_pool.hpp"

namespace dplb::server {

// Shared by every thread; outlives every worker.
struct shared_state {
  const config::settings& settings;
  const std::vector<upstream::backend>& backends;
  balancer::balancer& balancer;
  metrics::proxy_metrics& metrics;
};

// One per worker thread; only that thread touches it.
struct worker_state {
  shared_state& shared;
  upstream::connection_pool& pool;
};

}  // namespace dplb::server
