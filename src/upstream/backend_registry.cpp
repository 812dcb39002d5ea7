#include "dplb/upstream/backend_registry.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>

#include "dplb/balancer/balancer.hpp"
#include "dplb/metrics/proxy_metrics.hpp"
#include "dplb/upstream/health_monitor.hpp"

namespace dplb::upstream {

std::string_view name_of(backend_state state) noexcept {
  switch (state) {
    case backend_state::active: return "active";
    case backend_state::removing: return "removing";
    case backend_state::removed: return "removed";
  }
  return "unknown";
}

backend_registry::backend_registry(topology& topology, balancer::balancer& balancer, metrics::proxy_metrics& metrics,
                                   health_monitor& health, std::vector<std::string> clusters, resolver resolve,
                                   std::vector<config::rank_role> roles)
    : topology_(topology), balancer_(balancer), metrics_(metrics), health_(health), clusters_(std::move(clusters)),
      roles_(std::move(roles)), resolve_(std::move(resolve)),
      states_(topology.backends().size(), backend_state::active) {}

std::optional<std::size_t> backend_registry::cluster_named(std::string_view name, config::rank_role role) const {
  for (std::size_t c = 0; c < clusters_.size(); ++c) {
    if (clusters_[c] != name) continue;
    const auto own = role_of_cluster(c);
    // `both` asks for the cluster requests go to: a co-located one, or a disaggregated one's decode pool.
    if (own == role || (role == config::rank_role::both && own != config::rank_role::prefill)) return c;
  }
  return std::nullopt;
}

const backend* backend_registry::active(std::string_view url) const {
  const auto backends = topology_.backends();
  for (std::size_t i = 0; i < backends.size(); ++i) {
    if (backends[i].url == url && states_[i] == backend_state::active) return &backends[i];
  }
  return nullptr;
}

std::size_t backend_registry::rank_count() const noexcept { return balancer_.rank_count(); }

rank_status backend_registry::status_of_rank(std::size_t rank) const {
  const auto& entry = topology_.ranks()[rank];
  const auto& b = topology_.backends()[entry.backend];
  const auto outcomes = metrics_.outcomes(rank);
  rank_status out{.rank = rank,
                  .url = b.url,
                  .index_in_url = entry.rank_in_url,
                  .dp = b.dp,
                  .backend = states_.at(b.index),
                  .cluster = clusters_.at(b.cluster),
                  .policy = policy_name(b.cluster),
                  .role = entry.role,
                  .weight = balancer_.weight(rank),
                  .flags = balancer_.flags(rank),
                  .inflight = balancer_.inflight(rank),
                  .tokens_inflight = balancer_.cost_inflight(rank),
                  .requests = balancer_.picks(rank),
                  .responses = outcomes.responses,
                  .server_errors = outcomes.server_errors,
                  .upstream_errors = outcomes.upstream_errors,
                  .engine = std::nullopt,
                  .kv_events = std::nullopt};
  if (const auto stats = balancer_.engine_stats_of(rank); stats.ever) {
    out.engine = rank_status::engine_reading{stats.load, stats.age};
  }
  if (const auto* feed = kv_events_ != nullptr ? kv_events_->feed(rank) : nullptr;
      feed != nullptr && feed->configured.load(std::memory_order_relaxed)) {
    rank_status::kv_reading kv{.blocks = feed->blocks.load(std::memory_order_relaxed),
                               .events = feed->events.load(std::memory_order_relaxed),
                               .errors = feed->errors.load(std::memory_order_relaxed),
                               .lag_seconds = std::nullopt};
    if (const double ts = feed->last_batch_ts.load(std::memory_order_relaxed); ts > 0) {
      kv.lag_seconds = std::max(0.0, feed->last_batch_arrival.load(std::memory_order_relaxed) - ts);
    }
    out.kv_events = kv;
  }
  return out;
}

backend_status backend_registry::status_of(const backend& b) const {
  backend_status out{.url = b.url, .dp = b.dp, .cluster = clusters_.at(b.cluster), .state = states_.at(b.index), .ranks = {}};
  for (std::size_t r = b.first_rank; r < b.first_rank + b.dp; ++r) out.ranks.push_back(status_of_rank(r));
  return out;
}

std::vector<backend_status> backend_registry::listed_backends() const {
  std::vector<backend_status> out;
  for (const auto& b : topology_.backends()) {
    if (states_.at(b.index) != backend_state::removed) out.push_back(status_of(b));
  }
  return out;
}

std::string_view backend_registry::policy_name(std::size_t cluster) const { return balancer_.policy_of(cluster).name(); }

std::uint32_t backend_registry::inflight_skew() const noexcept { return balancer_.inflight_skew(); }

void backend_registry::set_draining(std::size_t rank, bool on) {
  balancer_.set_flag(rank, balancer::rank_flag::draining, on);
  metrics_.rank_draining(rank, on);
  spdlog::info("rank {} ({}) {} by the admin API", rank, topology_.ranks()[rank].name, on ? "drained" : "undrained");
}

void backend_registry::set_weight(std::size_t rank, std::uint32_t weight) {
  balancer_.set_weight(rank, weight);
  spdlog::info("rank {} ({}) weight set to {} by the admin API", rank, topology_.ranks()[rank].name, weight);
}

void backend_registry::set_state(const backend& b, backend_state state) {
  states_[b.index] = state;
  for (std::size_t r = b.first_rank; r < b.first_rank + b.dp; ++r) {
    balancer_.set_flag(r, balancer::rank_flag::removed, state != backend_state::active);
  }
}

namespace {

bool same_addresses(std::vector<boost::asio::ip::tcp::endpoint> a, std::vector<boost::asio::ip::tcp::endpoint> b) {
  std::ranges::sort(a);
  std::ranges::sort(b);
  return a == b;
}

}  // namespace

backend_registry::prepared_add backend_registry::prepare_add(const config::backend_spec& spec,
                                                             const std::vector<std::string>& leaving,
                                                             std::size_t& new_ranks) const {
  if (spec.cluster >= clusters_.size()) throw backend_change_error(400, "no cluster " + std::to_string(spec.cluster));
  if (const auto* served = active(spec.url); served && std::ranges::find(leaving, spec.url) == leaving.end()) {
    throw backend_change_error(409, spec.url + " is already a backend (ranks " + std::to_string(served->first_rank) +
                                        ".." + std::to_string(served->first_rank + served->dp - 1) +
                                        "); to change its weight use PUT /ranks/{rank}/weight, to change its dp "
                                        "remove it first");
  }
  prepared_add out{spec, {}, nullptr};
  out.spec.role = role_of_cluster(spec.cluster);  // a rank's role is its cluster's, whatever the caller said
  try {
    out.resolved = resolve_(out.spec);  // every time: an engine may have moved since it was last added
    out.resolved.role = out.spec.role;
  } catch (const config::config_error& e) {
    throw backend_change_error(400, e.what());
  }
  // A removed backend with the same URL, dp, cluster and addresses comes back under its ranks. Anything else
  // is another set of ranks: new ones (the old, if still draining out, finish on their own connections).
  for (const auto& b : topology_.backends()) {
    if (b.url == spec.url && b.dp == spec.dp && b.cluster == spec.cluster && b.kv_events == spec.kv_events &&
        b.kv_replay == spec.kv_replay && states_[b.index] != backend_state::active &&
        same_addresses(b.endpoints, out.resolved.endpoints)) {
      out.revive = &b;
    }
  }
  if (!out.revive) {
    if (topology_.ranks().size() + new_ranks + spec.dp > topology_.capacity()) {
      throw backend_change_error(507, "no room for " + std::to_string(spec.dp) + " more ranks: dplb serves at most " +
                                          std::to_string(topology_.capacity()) +
                                          " over its lifetime (a removed backend keeps its ranks); restart dplb to "
                                          "renumber");
    }
    new_ranks += spec.dp;
  }
  return out;
}

const backend& backend_registry::add(const config::backend_spec& spec) {
  std::size_t new_ranks = 0;
  return apply(prepare_add(spec, {}, new_ranks));
}

const backend& backend_registry::apply(prepared_add change) {
  const auto& spec = change.spec;
  if (change.revive) return revive(*change.revive, spec);
  const backend& added = topology_.add(std::move(change.resolved), spec.weight, spec.cluster);
  states_.push_back(backend_state::active);
  std::vector<std::uint32_t> weights(added.dp, spec.weight);
  for (std::uint32_t k = 0; k < added.dp; ++k) metrics_.add_rank(added.url, clusters_[spec.cluster], added.role);
  balancer_.add_ranks(weights, spec.cluster);
  health_.add_ranks();
  spdlog::info("backend {} added: ranks {}..{}, weight {}", added.url, added.first_rank, added.first_rank + added.dp - 1,
               spec.weight);
  if (added.kv_events && kv_events_ == nullptr) {
    spdlog::warn("backend {}: its KV-cache events are not read: this dplb started with no prefix-aware cluster and no "
                 "backend with #kv-events=, so it runs no events subscriber; restart it to read them", added.url);
  }
  return added;
}

const backend& backend_registry::revive(const backend& b, const config::backend_spec& spec) {
  for (std::size_t r = b.first_rank; r < b.first_rank + b.dp; ++r) {
    metrics_.restore_rank(r);
    health_.restart(r);
    balancer_.set_weight(r, spec.weight);
    balancer_.set_flag(r, balancer::rank_flag::draining, false);
    metrics_.rank_draining(r, false);
  }
  set_state(b, backend_state::active);
  spdlog::info("backend {} added back: ranks {}..{}, weight {}", b.url, b.first_rank, b.first_rank + b.dp - 1,
               spec.weight);
  return b;
}

const backend& backend_registry::remove(std::string_view url) {
  const auto* b = active(url);
  if (!b) throw backend_change_error(404, "no active backend " + std::string(url) + "; GET /ranks lists them");
  set_state(*b, backend_state::removing);
  spdlog::info("backend {} removed: ranks {}..{} take no new request; it leaves once its requests have finished",
               b->url, b->first_rank, b->first_rank + b->dp - 1);
  retire_drained();  // at once when nothing is in flight
  return *b;
}

std::vector<std::string> backend_registry::retire_drained() {
  std::vector<std::string> retired;
  const auto backends = topology_.backends();
  for (std::size_t i = 0; i < states_.size(); ++i) {
    if (states_[i] != backend_state::removing) continue;
    const auto& b = backends[i];
    bool idle = true;
    for (std::size_t r = b.first_rank; r < b.first_rank + b.dp; ++r) idle = idle && balancer_.inflight(r) == 0;
    if (!idle) continue;
    states_[i] = backend_state::removed;
    for (std::size_t r = b.first_rank; r < b.first_rank + b.dp; ++r) metrics_.retire_rank(r);
    spdlog::info("backend {} retired: its last request finished", b.url);
    retired.push_back(b.url);
  }
  return retired;
}

reload_summary backend_registry::reload(const std::vector<config::backend_spec>& specs) {
  // Everything that can fail (a host that does not resolve, no room) is checked before anything changes:
  // a reload applies whole or not at all.
  reload_summary summary;
  const auto wanted = [&](const backend& b) {
    return std::ranges::any_of(specs, [&](const config::backend_spec& s) {
      return s.url == b.url && s.dp == b.dp && s.cluster == b.cluster && s.kv_events == b.kv_events &&
             s.kv_replay == b.kv_replay;
    });
  };
  const auto backends = topology_.backends();
  for (const auto& b : backends) {
    if (states_[b.index] == backend_state::active && !wanted(b)) summary.removed.push_back(b.url);
  }
  std::vector<prepared_add> adds;
  std::vector<std::pair<const backend*, std::uint32_t>> weights;
  std::size_t new_ranks = 0;
  for (const auto& spec : specs) {
    const auto* kept = active(spec.url);
    if (kept && std::ranges::find(summary.removed, spec.url) == summary.removed.end()) {
      weights.emplace_back(kept, spec.weight);
      continue;
    }
    adds.push_back(prepare_add(spec, summary.removed, new_ranks));
    summary.added.push_back(spec.url);
  }
  // Removals first: a URL whose dp, cluster or event sources changed leaves before it comes back with its new
  // ranks (whose event indexes start empty).
  for (const auto& url : summary.removed) remove(url);
  for (auto& change : adds) apply(std::move(change));
  for (const auto& [b, weight] : weights) {
    bool changed = false;
    for (std::size_t r = b->first_rank; r < b->first_rank + b->dp; ++r) {
      changed = changed || balancer_.weight(r) != weight;
      balancer_.set_weight(r, weight);
    }
    if (changed) summary.reweighted.push_back(b->url);
  }
  return summary;
}

}  // namespace dplb::upstream
