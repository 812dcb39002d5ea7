#pragma once
// Changes the set of backends while dplb runs: the admin API adds and removes them, and SIGHUP makes the
// set match the config file again. Every part that follows the ranks (topology, metrics, balancer,
// health) learns of a change here, in an order that keeps each consistent for the threads reading it:
//  - added: the topology first, then the metrics, then the balancer (from then on the ranks can be
//    picked), then the health monitor (which accepts outcomes of ranks it has not met yet);
//  - removed: the balancer's `removed` flag at once (no new request; what is in flight finishes; no more
//    health checks nor engine-stats reads), and the backend leaves the metrics once its last request is
//    done (retire_drained(), called periodically);
//  - added again after a removal, with the same URL, dp and cluster, and its host resolving to the same
//    addresses: it comes back under its old ranks, with fresh health, at the configured weight (and through
//    the slow start, if on). Otherwise it gets new ranks.
// Rank numbers are never reused for another backend (the topology is append-only).
//
// The registry is also the one place that knows every part of a rank, so it owns the read model the
// admin API and the status page show (rank_status, backend_status) and the admin's two per-rank changes
// (drain, weight): their callers hold the registry and nothing else.
//
// Threading contract: one thread (the main thread's loop: the admin API, SIGHUP and the retirement
// timer all run there). What it changes is thread-safe for the other threads.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "dplb/balancer/policy.hpp"
#include "dplb/config/settings.hpp"
#include "dplb/kv/event_index.hpp"
#include "dplb/upstream/backend.hpp"

namespace dplb::balancer {
class balancer;
}
namespace dplb::metrics {
class proxy_metrics;
}

namespace dplb::upstream {

class health_monitor;

// A change refused, with the HTTP status the admin API answers and a message that says what to do.
class backend_change_error : public std::runtime_error {
 public:
  backend_change_error(unsigned status, const std::string& message) : std::runtime_error(message), status_(status) {}
  unsigned status() const noexcept { return status_; }

 private:
  unsigned status_;
};

enum class backend_state {
  active,    // takes requests (unless a rank is down or drained)
  removing,  // removed: takes no new request, its requests in flight finish
  removed,   // none left in flight: out of the metrics, the health checks and the stats reads
};
std::string_view name_of(backend_state state) noexcept;

// What dplb knows of one rank at one moment, for people (the admin API, the status page): each number is
// read on its own, so the whole is a view, not a consistent cut. The strings live as long as the registry.
struct rank_status {
  std::size_t rank = 0;
  std::string_view url;            // its backend's
  std::uint32_t index_in_url = 0;  // 0..dp-1: the X-data-parallel-rank it sends on a `#dp=N` backend
  std::uint32_t dp = 1;
  backend_state backend = backend_state::active;
  std::string_view cluster;
  std::string_view policy;  // its cluster's
  config::rank_role role = config::rank_role::both;
  std::uint32_t weight = 1;
  std::uint8_t flags = 0;  // balancer::rank_flag bits: usable when none is set
  std::uint32_t inflight = 0;
  std::uint64_t tokens_inflight = 0;
  std::uint64_t requests = 0;         // ever sent to it
  std::uint64_t responses = 0;        // answered, any status
  std::uint64_t server_errors = 0;    // answered 5xx
  std::uint64_t upstream_errors = 0;  // failed attempts of any kind
  struct engine_reading {
    balancer::engine_load load;
    std::chrono::steady_clock::duration age{};
  };
  std::optional<engine_reading> engine;  // its engine's last good stats read; none yet without one
  // What its KV-cache events gave dplb's index (a rank whose backend has #kv-events=); none otherwise.
  struct kv_reading {
    std::uint64_t blocks = 0;  // indexed now
    std::uint64_t events = 0;  // applied so far
    std::uint64_t errors = 0;  // skipped so far
    std::optional<double> lag_seconds;  // arrival minus the engine's timestamp of the last batch; none before one
  };
  std::optional<kv_reading> kv_events;
};

struct backend_status {
  std::string_view url;
  std::uint32_t dp = 1;
  std::string_view cluster;
  backend_state state = backend_state::active;
  std::vector<rank_status> ranks;
};

struct reload_summary {
  std::vector<std::string> added, removed, reweighted;  // URLs
};

class backend_registry {
 public:
  using resolver = std::function<backend(const config::backend_spec&)>;

  // `clusters` names the clusters, in index order (fixed for the process's life); `roles` gives their
  // roles (empty: every cluster co-located). A disaggregated cluster's two pools share its name.
  backend_registry(topology& topology, balancer::balancer& balancer, metrics::proxy_metrics& metrics,
                   health_monitor& health, std::vector<std::string> clusters = {config::implicit_cluster_name},
                   resolver resolve = resolve_backend, std::vector<config::rank_role> roles = {});

  // Adds a backend (or brings a removed one back: same URL, dp and cluster, and its host still resolves to
  // the same addresses). Its host is resolved on every add. Throws backend_change_error: 409 when the URL
  // is already served, 400 when its host does not resolve, 507 when the topology has no room left.
  const backend& add(const config::backend_spec& spec);

  // Removes the active backend with this (normalised) URL. Throws backend_change_error 404 when none.
  const backend& remove(std::string_view url);

  // Makes the active set match `specs`: removes the backends not in it (URL, dp, cluster), adds new ones,
  // and sets the configured weight where it changed. A backend whose dp, cluster or KV-event sources changed is removed and
  // added anew (new ranks). All or nothing: every new backend is resolved, and the room checked, before
  // anything changes; throws backend_change_error for the first that cannot be added, having changed nothing.
  reload_summary reload(const std::vector<config::backend_spec>& specs);

  // Finishes the removals whose last request is done. Returns the backends retired.
  std::vector<std::string> retire_drained();

  // The read model (see rank_status).
  std::size_t rank_count() const noexcept;  // ranks ever added: 0..rank_count()-1 are valid
  rank_status status_of_rank(std::size_t rank) const;
  backend_status status_of(const backend& b) const;
  std::vector<backend_status> listed_backends() const;  // every backend not yet retired, in rank order
  std::string_view policy_name(std::size_t cluster) const;
  std::uint32_t inflight_skew() const noexcept;  // the widest within one cluster (dplb_inflight_skew)

  // The KV-cache event index whose per-rank figures rank_status shows (null: none). Before serving.
  void observe_kv_events(const kv::event_index* index) { kv_events_ = index; }

  // The admin's per-rank changes. Draining sets only the draining flag (the health checks own the others,
  // so neither undoes the other's verdict) and its gauge; both are logged.
  void set_draining(std::size_t rank, bool on);
  void set_weight(std::size_t rank, std::uint32_t weight);

  backend_state state_of(std::size_t backend) const { return states_.at(backend); }
  const std::string& cluster_name(std::size_t cluster) const { return clusters_.at(cluster); }
  // The cluster of that name (of a disaggregated one, its pool with `role`; both: its decode pool).
  std::optional<std::size_t> cluster_named(std::string_view name,
                                           config::rank_role role = config::rank_role::both) const;
  config::rank_role role_of_cluster(std::size_t cluster) const {
    return cluster < roles_.size() ? roles_[cluster] : config::rank_role::both;
  }
  // The active backend with this normalised URL, or nullptr.
  const backend* active(std::string_view url) const;

 private:
  // An add checked and resolved, not yet applied.
  struct prepared_add {
    config::backend_spec spec;
    backend resolved;
    const backend* revive = nullptr;  // a removed backend it brings back, instead of new ranks
  };
  // Checks an add (cluster, URL not served unless `leaving`, room for `new_ranks` more plus its own) and
  // resolves its host; changes nothing. Counts its new ranks into `new_ranks`.
  prepared_add prepare_add(const config::backend_spec& spec, const std::vector<std::string>& leaving,
                           std::size_t& new_ranks) const;
  const backend& apply(prepared_add change);
  void set_state(const backend& b, backend_state state);
  const kv::event_index* kv_events_ = nullptr;
  const backend& revive(const backend& b, const config::backend_spec& spec);

  topology& topology_;
  balancer::balancer& balancer_;
  metrics::proxy_metrics& metrics_;
  health_monitor& health_;
  std::vector<std::string> clusters_;
  std::vector<config::rank_role> roles_;
  resolver resolve_;
  std::vector<backend_state> states_;  // per backend, in topology order
};

}  // namespace dplb::upstream
