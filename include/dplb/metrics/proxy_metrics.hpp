#pragma once
// dplb's Prometheus metrics. Every family is registered once at start-up and the per-rank handles are
// kept (prometheus-cpp's Family::Add takes a lock and hashes labels: too slow for the request path). The
// histograms recorded per request are dplb's own lock-free ones (atomic_histogram.hpp), added to the
// registry's families at each scrape.
// The in-flight gauges are not updated per request: they are read from the balancer's atomics when
// /metrics is scraped, so they can never drift from the counts that drive the balancing.
//
// Threading contract: every member may be called from any thread.

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/metric_family.h>
#include <prometheus/registry.h>

#include "dplb/config/settings.hpp"
#include "dplb/support/atomic_histogram.hpp"

namespace dplb::balancer {
class balancer;
struct routing_stats;
class replica_ledger;
}

namespace dplb::support {
class supervisor;
}
namespace dplb::kv {
class event_index;
}
namespace dplb::tenants {
class tenant_book;
}

namespace dplb::metrics {
class access_log;

// The `kind` label values of dplb_upstream_errors_total: connect (refused, unreachable, timed out),
// reset (closed before any answer on a fresh connection), timeout (no response head in time), protocol
// (an unparseable response), server_error (a 5xx head), midstream (failed after the response began).
inline constexpr std::array<std::string_view, 6> upstream_error_kinds{"connect", "reset", "timeout",
                                                                      "protocol", "server_error", "midstream"};

// The tenants' families, as the scrape shows them (tenant_families.cpp).
std::vector<prometheus::MetricFamily> tenant_families(const tenants::tenant_book& book);

class proxy_metrics {
 public:
  // `rank_urls[r]` is rank r's backend URL (each in the "default" cluster; add_rank adds ranks of any
  // cluster). Room is made for `capacity` ranks (at least as many), since the request path indexes the
  // per-rank handles without a lock.
  proxy_metrics(const std::vector<std::string>& rank_urls, const balancer::balancer& balancer,
                std::string_view policy_name, std::size_t capacity = 0);
  ~proxy_metrics();

  // Ranks come and go at runtime (one thread at a time, as the topology's add()). add_rank takes the next
  // rank number; a retired rank's series leave the exposition (its handles stay, so that a late call on
  // it is harmless) and come back, with their values, when it is restored.
  void add_rank(const std::string& url, const std::string& cluster = "default",
                config::rank_role role = config::rank_role::both);
  void retire_rank(std::size_t rank);
  void restore_rank(std::size_t rank);

  // A proxied request finished (response relayed, or dplb answered an error on the rank's behalf).
  void request_finished(std::size_t rank, unsigned status, std::chrono::duration<double> duration);
  // The engine's response head arrived this long after dplb picked the rank.
  void first_byte(std::size_t rank, std::chrono::duration<double> since_pick);
  void tokens(std::size_t rank, std::uint64_t prompt, std::uint64_t completion);
  // A request dplb answered itself without choosing a rank (bad request, no usable rank, ...).
  void rejected(unsigned status);

  void upstream_connected(std::size_t rank);
  // A pooled connection was found closed before any response byte and the request was re-sent.
  void keepalive_retry(std::size_t rank);
  // An attempt on the rank failed; kind is one of upstream_error_kinds.
  void upstream_error(std::size_t rank, std::string_view kind);
  // A request was re-sent to another rank after its rank failed before answering.
  void retried();
  // Health as decided by the health monitor.
  void rank_state(std::size_t rank, bool healthy, bool ejected);
  void ejected(std::size_t rank);
  // The admin drained the rank (or ended its drain).
  void rank_draining(std::size_t rank, bool draining);

  // Prefill/decode disaggregation: its families (dplb_pd_leg_duration_seconds{leg},
  // dplb_pd_prefill_skipped_total) are shown from now on. Before serving.
  void observe_disaggregation() { disaggregated_ = true; }
  // A prefill leg ended (sent to its whole answer read), or a decode leg (sent to the end of its response).
  void prefill_leg(std::chrono::duration<double> took) { prefill_leg_.observe(took.count()); }
  void decode_leg(std::chrono::duration<double> took) { decode_leg_.observe(took.count()); }
  // A request ran in one leg on its decode rank, which held its prompt (--pd-skip-prefill-ratio).
  void prefill_skipped() noexcept { prefill_skipped_.fetch_add(1, std::memory_order_relaxed); }

  // A request of this priority (the body's, 0 without one) waited this long in dplb's queue
  // (--max-inflight-per-rank) before it got a slot or gave up.
  void queued(std::chrono::duration<double> waited, std::int64_t priority = 0);
  // The priority bands of dplb_queue_wait_by_priority_seconds{band}: high (a priority below 0), normal (0),
  // low (above 0). Three, whatever the priorities clients send: the label's values stay bounded.
  static constexpr std::array<std::string_view, 3> priority_bands{"high", "normal", "low"};

  // The tenants' families (dplb_tenant_requests_total{tenant,code}, dplb_tenant_queued{tenant},
  // dplb_tenant_in_flight{tenant}, dplb_tenant_tokens_total{tenant,kind}), one series per tenant ever
  // configured, shown from now on. `tenants` must outlive this. Before serving.
  void observe_tenants(const tenants::tenant_book& tenants) { tenants_ = &tenants; }

  void client_connection_opened();
  void client_connection_closed();

  // Prefix-aware routing and session affinity decisions (balancer/routing_stats.hpp), shown from now on:
  // the prefix families when `prefix` (some cluster uses prefix-aware), the affinity one when
  // `affinity` (--affinity-header). `stats` must outlive this. Before serving.
  void observe_routing(const balancer::routing_stats& stats, bool prefix, bool affinity);
  // The KV-cache event feeds (dplb_kv_events_total, dplb_kv_event_errors_total, dplb_kv_blocks,
  // dplb_kv_index_resets_total, dplb_kv_events_replayed_total, dplb_kv_event_lag_seconds; each for the
  // ranks with an event source) and --tokenize engine's outcomes (dplb_tokenize_requests_total), shown from
  // now on. `events` must outlive this. Before serving.
  void observe_kv_events(const kv::event_index& events, bool tokenize);
  // A /tokenize asked of an engine for a request: its ids were read (ok), or not (no answer, an error, not
  // ids): the request was then matched without them.
  void tokenized(bool ok) {
    tokenize_outcomes_[ok ? 0 : 1].fetch_add(1, std::memory_order_relaxed);
  }
  // The access log's dropped lines (dplb_access_log_dropped_total), shown from now on. Before serving.
  void observe_access_log(const access_log& log) { access_log_ = &log; }
  // The background tasks' failures (dplb_internal_errors_total{task}), every task's series from now on, 0
  // until it fails. Before serving.
  void observe_internal_errors(const support::supervisor& supervisor) { supervisor_ = &supervisor; }

  // The ledger replicas share (--shared-state): dplb_shared_state_up, dplb_shared_state_errors_total{op},
  // dplb_shared_state_pick_seconds and dplb_shared_state_replicas, shown from now on. `ledger` must outlive
  // this. Before serving.
  void observe_shared_state(const balancer::replica_ledger& ledger) { ledger_ = &ledger; }

  // The Prometheus text exposition of every metric, with gauges refreshed from the balancer.
  std::string render();

  // A rank's request outcomes so far, read from the same counters as dplb_requests_total{rank,code} and
  // dplb_upstream_errors_total{rank} (for the admin API: a read of atomics, nothing on the request path
  // changes). All zero for a rank the metrics do not know.
  struct rank_outcomes {
    std::uint64_t responses = 0;        // requests finished on the rank, whatever their status (499 included)
    std::uint64_t server_errors = 0;    // of them, those with a 5xx status: the engine's, or dplb's 502/503/504
    std::uint64_t upstream_errors = 0;  // failed attempts on the rank, of any kind (retried ones included)
  };
  rank_outcomes outcomes(std::size_t rank) const;

 private:
  struct rank_handles {
    prometheus::Gauge* inflight;
    prometheus::Gauge* tokens_inflight;
    prometheus::Gauge* healthy;
    std::unique_ptr<support::atomic_histogram> duration;  // each on its own allocation: no line shared between ranks
    std::unique_ptr<support::atomic_histogram> ttfb;
    prometheus::Counter* prompt_tokens;
    prometheus::Counter* completion_tokens;
    prometheus::Counter* connects;
    prometheus::Counter* keepalive_retries;
    prometheus::Gauge* ejected;
    prometheus::Counter* ejections;
    prometheus::Gauge* draining;
    std::array<prometheus::Counter*, upstream_error_kinds.size()> errors;
    std::unique_ptr<std::array<std::atomic<prometheus::Counter*>, 600>> by_status;  // lazily filled
    // The engine's own numbers: added at the first scrape after the first good read (until then there is
    // nothing to show, and a 0 would read as an idle engine).
    prometheus::Gauge* engine_running = nullptr;
    prometheus::Gauge* engine_waiting = nullptr;
    prometheus::Gauge* engine_kv_cache_usage = nullptr;
    prometheus::Gauge* engine_stats_age = nullptr;
  };
  void refresh_engine_stats(std::size_t rank);
  std::size_t rank_count() const noexcept { return rank_count_.load(std::memory_order_acquire); }
  bool retired(std::size_t rank) const;  // render_mutex_ held

  prometheus::Counter& status_counter(std::size_t rank, unsigned status);
  // The lock-free histograms as Prometheus families, for the scrape.
  std::vector<prometheus::MetricFamily> histogram_families() const;
  // The routing decisions' families (observe_routing), for the scrape.
  std::vector<prometheus::MetricFamily> routing_families() const;
  // The KV-cache event feeds' families (observe_kv_events), for the scrape.
  std::vector<prometheus::MetricFamily> kv_event_families() const;
  const kv::event_index* kv_events_ = nullptr;
  // The shared ledger's families (observe_shared_state), for the scrape.
  std::vector<prometheus::MetricFamily> shared_state_families() const;
  const balancer::replica_ledger* ledger_ = nullptr;
  bool tokenize_ = false;
  std::array<std::atomic<std::uint64_t>, 2> tokenize_outcomes_{};  // ok, failed

  const balancer::routing_stats* routing_ = nullptr;
  const access_log* access_log_ = nullptr;
  const support::supervisor* supervisor_ = nullptr;
  bool routing_prefix_ = false;
  bool routing_affinity_ = false;

  const balancer::balancer& balancer_;
  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Counter>& requests_family_;
  prometheus::Family<prometheus::Counter>& rejected_family_;
  prometheus::Gauge& skew_;
  prometheus::Gauge& client_connections_;
  prometheus::Counter& client_connections_total_;
  prometheus::Counter& retries_;
  prometheus::Gauge& queue_depth_;
  std::mutex render_mutex_;
  prometheus::Family<prometheus::Gauge>& engine_running_;
  prometheus::Family<prometheus::Gauge>& engine_waiting_;
  prometheus::Family<prometheus::Gauge>& engine_kv_cache_usage_;
  prometheus::Family<prometheus::Gauge>& engine_stats_age_;
  support::atomic_histogram queue_wait_;
  std::array<std::unique_ptr<support::atomic_histogram>, priority_bands.size()> queue_wait_by_band_;
  const tenants::tenant_book* tenants_ = nullptr;
  bool disaggregated_ = false;
  support::atomic_histogram prefill_leg_;
  support::atomic_histogram decode_leg_;
  std::atomic<std::uint64_t> prefill_skipped_{0};
  std::array<std::atomic<prometheus::Counter*>, 600> rejected_by_status_{};  // lazily filled
  // The per-rank families, for add_rank.
  struct rank_families {
    prometheus::Family<prometheus::Gauge>& inflight;
    prometheus::Family<prometheus::Gauge>& tokens_inflight;
    prometheus::Family<prometheus::Gauge>& healthy;
    prometheus::Family<prometheus::Counter>& prompt;
    prometheus::Family<prometheus::Counter>& completion;
    prometheus::Family<prometheus::Counter>& connects;
    prometheus::Family<prometheus::Counter>& keepalive_retries;
    prometheus::Family<prometheus::Counter>& errors;
    prometheus::Family<prometheus::Gauge>& ejected;
    prometheus::Family<prometheus::Counter>& ejections;
    prometheus::Family<prometheus::Gauge>& draining;
    prometheus::Family<prometheus::Gauge>& cluster;
    prometheus::Family<prometheus::Gauge>& role;
  };
  rank_families families_;
  // Allocated once for the capacity: [0, rank_count_) are in use, and an entry never changes once
  // published (the engine-stats gauges aside, which only render() touches, under render_mutex_).
  std::size_t capacity_;
  std::unique_ptr<rank_handles[]> ranks_;
  std::unique_ptr<std::string[]> rank_labels_;
  std::atomic<std::size_t> rank_count_{0};
  std::vector<char> retired_;  // per rank; guarded by render_mutex_
};

}  // namespace dplb::metrics
