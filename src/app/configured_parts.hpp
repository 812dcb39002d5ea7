#pragma once
// Private to the application: the parts a configuration makes before anything runs (each cluster's policy,
// the KV-cache event index, the topology, the registry's view of the clusters), and a reloaded
// configuration's backends mapped onto the running clusters. Plain functions of the settings: the
// application wires their results together and runs them.

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "dplb/balancer/policy.hpp"
#include "dplb/balancer/replica_ledger.hpp"
#include "dplb/balancer/routing_stats.hpp"
#include "dplb/config/settings.hpp"
#include "dplb/kv/event_index.hpp"
#include "dplb/tenants/tenant_book.hpp"
#include "dplb/upstream/backend.hpp"

namespace dplb::app {

// Whether some cluster's policy balances on engine stats (then they are read by default).
bool uses_engine_stats(const config::settings& s);
// One policy per cluster, in cluster order.
std::vector<std::unique_ptr<balancer::policy>> cluster_policies(const config::settings& s, balancer::routing_stats* stats,
                                                                const kv::event_index* events);
// The KV-cache event index, when something reads or may read events; else null.
std::unique_ptr<kv::event_index> kv_event_index(const config::settings& s, std::size_t capacity);
// The clusters' names and roles, in index order (the backend registry's view of them).
std::vector<std::string> cluster_names(const config::settings& s);
std::vector<config::rank_role> cluster_roles(const config::settings& s);
// The backends of a configuration read again (SIGHUP), numbered by the running clusters; throws
// config::config_error for a cluster that is new or changed between co-located and disaggregated.
std::vector<config::backend_spec> backends_for_reload(const config::settings& running, const config::settings& fresh);
// Each rank's cluster, in rank order.
std::vector<std::size_t> rank_clusters(const upstream::topology& topology);
// The age past which engine stats are stale.
std::chrono::milliseconds stats_max_age(const config::settings& s);
// The configured tenants; throws config::config_error, saying what to fix, for a list it refuses.
std::unique_ptr<tenants::tenant_book> configured_tenants(const config::settings& s);
// The shared ledger's options (--shared-state): its namespace is a digest of the backend list, so that only
// replicas in front of the same ranks, numbered alike, share counts.
balancer::replica_ledger_options shared_ledger_options(const config::settings& s);
// Every configured backend, resolved (blocking) and numbered.
std::unique_ptr<upstream::topology> configured_topology(const std::vector<config::backend_spec>& specs);

}  // namespace dplb::app
