#include "configured_parts.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <string>

#include "dplb/balancer/least_tokens.hpp"
#include "dplb/balancer/policy_factory.hpp"
#include "dplb/support/sha256.hpp"

namespace dplb::app {

namespace {

balancer::policy_options policy_options_of(const config::settings& s, balancer::routing_stats* stats,
                                           const kv::event_index* events) {
  return {.kv_weight = s.kv_pressure_weight,
          .prefix = {.load_bound = s.load_bound,
                     .min_match_blocks = (s.prefix_min_match + balancer::prefix_block_tokens - 1) / balancer::prefix_block_tokens,
                     .index_blocks_per_rank = s.prefix_index_blocks,
                     .events = events,
                     .block_size = s.block_size,
                     .event_min_match_blocks = (s.prefix_min_match + s.block_size - 1) / s.block_size},
          .stats = stats};
}

}  // namespace

// Whether some cluster's policy balances on engine stats (then they are read by default).
bool uses_engine_stats(const config::settings& s) {
  return std::ranges::any_of(s.clusters, [](const config::cluster_spec& c) {
    return balancer::make_policy(c.policy)->uses_engine_stats();
  });
}

// One policy per cluster, in cluster order.
std::vector<std::unique_ptr<balancer::policy>> cluster_policies(const config::settings& s, balancer::routing_stats* stats,
                                                                const kv::event_index* events) {
  std::vector<std::unique_ptr<balancer::policy>> out;
  for (const auto& c : s.clusters) out.push_back(balancer::make_policy(c.policy, policy_options_of(s, stats, events)));
  return out;
}

// The KV-cache event index, when something reads or may read events: a prefix-aware cluster, or a backend
// that publishes them (its metrics show even under another policy; backends with events may also be added
// at run time to a prefix-aware cluster).
std::unique_ptr<kv::event_index> kv_event_index(const config::settings& s, std::size_t capacity) {
  if (!config::any_cluster_uses(s, "prefix-aware") && !config::any_backend_has_kv_events(s)) return nullptr;
  return std::make_unique<kv::event_index>(s.kv_index_blocks, capacity);
}

std::vector<std::string> cluster_names(const config::settings& s) {
  std::vector<std::string> out;
  for (const auto& c : s.clusters) out.push_back(c.name);
  return out;
}

std::vector<config::rank_role> cluster_roles(const config::settings& s) {
  std::vector<config::rank_role> out;
  for (const auto& c : s.clusters) out.push_back(c.role);
  return out;
}

// The backends of a configuration read again (SIGHUP), numbered by the running clusters: those are fixed
// at start-up, so a backend joins the running cluster of its name (of a disaggregated one, the pool of its
// role), and a new name, or a cluster that changed between co-located and disaggregated, is refused.
std::vector<config::backend_spec> backends_for_reload(const config::settings& running, const config::settings& fresh) {
  std::vector<config::backend_spec> out;
  for (auto spec : fresh.backends) {
    const auto& name = fresh.clusters.at(spec.cluster).name;
    const auto same = std::ranges::find_if(running.clusters, [&](const config::cluster_spec& c) {
      return c.name == name && c.role == spec.role;
    });
    if (same == running.clusters.end()) {
      const bool known = std::ranges::find(running.clusters, name, &config::cluster_spec::name) != running.clusters.end();
      throw config::config_error("cluster '" + name + "' is " +
                                 (known ? "now " + std::string(spec.role == config::rank_role::both ? "co-located" : "disaggregated")
                                        : std::string("new")) +
                                 ": clusters change only with a restart");
    }
    if (same->models != fresh.clusters[spec.cluster].models || same->policy != fresh.clusters[spec.cluster].policy) {
      spdlog::warn("SIGHUP: cluster '{}' has other models or another policy in the configuration; those change "
                   "only with a restart (its backends are reloaded)", name);
    }
    spec.cluster = static_cast<std::size_t>(same - running.clusters.begin());
    out.push_back(std::move(spec));
  }
  return out;
}

std::vector<std::size_t> rank_clusters(const upstream::topology& topology) {
  std::vector<std::size_t> out;
  for (const auto& h : topology.ranks()) out.push_back(h.cluster);
  return out;
}

// Engine stats older than three reads (each bounded by the health-check timeout) are stale.
std::chrono::milliseconds stats_max_age(const config::settings& s) {
  return 3 * config::engine_stats_interval(s, uses_engine_stats(s)) + s.health_check_timeout;
}

std::unique_ptr<upstream::topology> configured_topology(const std::vector<config::backend_spec>& specs) {
  auto topology = std::make_unique<upstream::topology>();
  upstream::add_configured(*topology, specs);
  return topology;
}

std::unique_ptr<tenants::tenant_book> configured_tenants(const config::settings& s) {
  try {
    return std::make_unique<tenants::tenant_book>(s.tenants);
  } catch (const std::invalid_argument& e) {
    throw config::config_error(std::string("tenants: ") + e.what());
  }
}

balancer::replica_ledger_options shared_ledger_options(const config::settings& s) {
  balancer::replica_ledger_options o;
  o.ledger.endpoint = *s.shared_state;
  o.ledger.replica = s.replica_name;
  o.ledger.timeout = s.shared_state_timeout;
  o.ledger.least_tokens = {balancer::least_tokens::request_band, balancer::least_tokens::slot_tokens,
                           balancer::least_tokens::decode_share};
  // Rank numbers are the ledger's keys: replicas agree on them only with the same backends, in the same
  // order, in the same clusters, with the same DP sizes.
  std::string backends;
  for (const auto& b : s.backends) {
    backends += b.url + "#dp=" + std::to_string(b.dp) + "#cluster=" + std::to_string(b.cluster) + "#role=" +
                std::string(config::role_name(b.role)) + "\n";
  }
  const auto digest = support::sha256(backends);
  static constexpr char hex[] = "0123456789abcdef";
  for (std::size_t i = 0; i < 8; ++i) {
    o.ledger.ns += hex[digest[i] >> 4];
    o.ledger.ns += hex[digest[i] & 0xf];
  }
  for (const auto& cluster : s.clusters) o.rules.push_back(balancer::ledger_rule_for(cluster.policy));
  return o;
}

}  // namespace dplb::app
