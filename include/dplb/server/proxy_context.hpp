#pragma once
// What every session needs, bundled: the shared state (read-only configuration, the one balancer,
// the metrics) and the state of the worker thread the session runs on (its connection pool).

#include <atomic>
#include <cstddef>
#include <vector>

#include "dplb/balancer/balancer.hpp"
#include "dplb/config/settings.hpp"
#include "dplb/kv/event_index.hpp"
#include "dplb/metrics/access_log.hpp"
#include "dplb/metrics/proxy_metrics.hpp"
#include "dplb/server/deadline_sweeper.hpp"
#include "dplb/server/model_routes.hpp"
#include "dplb/server/pick_inputs.hpp"
#include "dplb/tenants/tenant_book.hpp"
#include "dplb/upstream/backend.hpp"
#include "dplb/upstream/connection_pool.hpp"
#include "dplb/upstream/health_monitor.hpp"
#include "dplb/support/io_types.hpp"

namespace dplb::upstream {
class model_context;
}
namespace dplb::balancer {
class replica_ledger;
}

namespace dplb::server {

// Shared by every thread; outlives every worker.
struct shared_state {
  const config::settings& settings;
  const upstream::topology& topology;
  balancer::balancer& balancer;
  metrics::proxy_metrics& metrics;
  upstream::health_monitor& health;
  const model_routes& models;
  tenants::tenant_book& tenants;                   // whose each request is, and each tenant's limits and counts
  metrics::access_log* access_log = nullptr;       // --access-log, else null
  // What the engines' KV-cache events say the ranks hold (prefix-aware): null when no policy reads them.
  const kv::event_index* kv_events = nullptr;
  // Each model's max_model_len, from the engines' /v1/models: what a request without max_tokens reserves
  // from its tenant's token budget. Null: unknown (tests of parts without it).
  const upstream::model_context* model_context = nullptr;
  // The ledger dplb replicas share (--shared-state): null without one.
  balancer::replica_ledger* ledger = nullptr;
  const pick_inputs reads{settings, balancer};  // what the picks read of a request's body
  std::atomic<std::size_t> client_connections{0};  // open now, all workers
  std::atomic<bool> draining{false};               // SIGTERM received: finish what is in flight, take nothing new
};

// The client connections of a worker that wait for their next request: a drain closes them at once. A
// session enters before each request head and leaves once it is in, so neither may allocate (a hash set
// did, one node per request): the set is a vector, and each member knows its slot, so that leaving is a
// swap with the last. It grows to the most connections ever idle at once, and stays that size.
class idle_client_set {
 public:
  static constexpr std::size_t not_member = static_cast<std::size_t>(-1);

  // `slot` belongs to the session and must stay where it is while the client is a member.
  void enter(io::tcp_stream& client, std::size_t& slot) {
    if (slot != not_member) return;
    members_.push_back(member{&client, &slot});  // first: if it throws, the slot still says not a member
    slot = members_.size() - 1;
  }
  void leave(std::size_t& slot) noexcept {
    if (slot == not_member) return;
    members_[slot] = members_.back();
    *members_[slot].slot = slot;
    members_.pop_back();
    slot = not_member;
  }
  std::size_t size() const noexcept { return members_.size(); }
  template <class Visit>
  void for_each(Visit visit) const {
    for (const member& m : members_) visit(*m.client);
  }

 private:
  struct member {
    io::tcp_stream* client;
    std::size_t* slot;
  };
  std::vector<member> members_;
};

// One per worker thread; only that thread touches it.
struct worker_state {
  shared_state& shared;
  upstream::connection_pool& pool;
  deadline_sweeper& deadlines;  // of every socket of the worker's sessions
  idle_client_set idle_clients;
};

}  // namespace dplb::server
