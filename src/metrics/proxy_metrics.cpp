#include "dplb/metrics/proxy_metrics.hpp"

#include "dplb/kv/event_index.hpp"

#include "dplb/metrics/access_log.hpp"

#include "dplb/balancer/routing_stats.hpp"

#include <prometheus/text_serializer.h>

#include "dplb/balancer/balancer.hpp"
#include "dplb/balancer/replica_ledger.hpp"
#include "dplb/support/supervisor.hpp"
#include "scraped_families.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace dplb::metrics {


proxy_metrics::proxy_metrics(const std::vector<std::string>& rank_urls, const balancer::balancer& balancer,
                             std::string_view policy_name, std::size_t capacity)
    : balancer_(balancer),
      registry_(std::make_shared<prometheus::Registry>()),
      requests_family_(prometheus::BuildCounter()
                           .Name("dplb_requests_total")
                           .Help("Requests proxied to a rank, by rank and final HTTP status")
                           .Register(*registry_)),
      rejected_family_(prometheus::BuildCounter()
                           .Name("dplb_rejected_requests_total")
                           .Help("Requests dplb answered itself without choosing a rank, by HTTP status")
                           .Register(*registry_)),
      skew_(prometheus::BuildGauge()
                .Name("dplb_inflight_skew")
                .Help("Max minus min in-flight requests over the usable ranks")
                .Register(*registry_)
                .Add({})),
      client_connections_(prometheus::BuildGauge()
                              .Name("dplb_client_connections")
                              .Help("Client connections open now")
                              .Register(*registry_)
                              .Add({})),
      client_connections_total_(prometheus::BuildCounter()
                                    .Name("dplb_client_connections_total")
                                    .Help("Client connections accepted")
                                    .Register(*registry_)
                                    .Add({})),
      retries_(prometheus::BuildCounter()
                   .Name("dplb_retries_total")
                   .Help("Requests re-sent to another rank because their rank failed before answering")
                   .Register(*registry_)
                   .Add({})),
      queue_depth_(prometheus::BuildGauge()
                       .Name("dplb_queue_depth")
                       .Help("Requests waiting in dplb for a rank slot (--max-inflight-per-rank)")
                       .Register(*registry_)
                       .Add({})),
      engine_running_(prometheus::BuildGauge()
                          .Name("dplb_engine_running")
                          .Help("Requests the rank's engine reports running (vllm:num_requests_running), at the "
                                "last good read of its /metrics")
                          .Register(*registry_)),
      engine_waiting_(prometheus::BuildGauge()
                          .Name("dplb_engine_waiting")
                          .Help("Requests the rank's engine reports waiting (vllm:num_requests_waiting), at the "
                                "last good read of its /metrics")
                          .Register(*registry_)),
      engine_kv_cache_usage_(prometheus::BuildGauge()
                                 .Name("dplb_engine_kv_cache_usage")
                                 .Help("KV-cache usage the rank's engine reports (vllm:kv_cache_usage_perc, 0..1), "
                                       "at the last good read of its /metrics")
                                 .Register(*registry_)),
      engine_stats_age_(prometheus::BuildGauge()
                            .Name("dplb_engine_stats_age_seconds")
                            .Help("Time since the last good read of the rank's engine stats; beyond the staleness "
                                  "bound the policies ignore them")
                            .Register(*registry_)),
      queue_wait_(latency_buckets()),
      prefill_leg_(latency_buckets()),
      decode_leg_(latency_buckets()),
      families_{
          prometheus::BuildGauge()
              .Name("dplb_rank_inflight")
              .Help("Requests dplb has sent to the rank and not yet finished")
              .Register(*registry_),
          prometheus::BuildGauge()
              .Name("dplb_rank_tokens_inflight")
              .Help("Tokens dplb counts in flight on the rank: under least-tokens each request's "
                    "prompt until the engine's first body byte plus the most it may generate; "
                    "under the other policies one per request")
              .Register(*registry_),
          prometheus::BuildGauge()
              .Name("dplb_rank_healthy")
              .Help("1 while the rank passes its active health checks (GET /health), 0 while it is down")
              .Register(*registry_),
          prometheus::BuildCounter()
              .Name("dplb_prompt_tokens_total")
              .Help("Prompt tokens reported in the usage of responses relayed from the rank")
              .Register(*registry_),
          prometheus::BuildCounter()
              .Name("dplb_completion_tokens_total")
              .Help("Completion tokens reported in the usage of responses relayed from the rank")
              .Register(*registry_),
          prometheus::BuildCounter()
              .Name("dplb_upstream_connections_total")
              .Help("New TCP connections opened to the rank (pooled reuse does not count)")
              .Register(*registry_),
          prometheus::BuildCounter()
              .Name("dplb_upstream_keepalive_retries_total")
              .Help("Requests re-sent on a fresh connection because a pooled one was found closed")
              .Register(*registry_),
          prometheus::BuildCounter()
              .Name("dplb_upstream_errors_total")
              .Help("Failed attempts on the rank, by kind (connect, reset, timeout, protocol, "
                    "server_error, midstream)")
              .Register(*registry_),
          prometheus::BuildGauge()
              .Name("dplb_rank_ejected")
              .Help("1 while the rank is ejected by passive outlier detection")
              .Register(*registry_),
          prometheus::BuildCounter()
              .Name("dplb_rank_ejections_total")
              .Help("Times the rank was ejected after consecutive failed requests")
              .Register(*registry_),
          prometheus::BuildGauge()
              .Name("dplb_rank_draining")
              .Help("1 while the admin API has the rank drained: requests in flight finish, no new one starts")
              .Register(*registry_),
          prometheus::BuildGauge()
              .Name("dplb_rank_cluster")
              .Help("Always 1; the cluster label names the cluster the rank serves")
              .Register(*registry_),
          prometheus::BuildGauge()
              .Name("dplb_rank_role")
              .Help("Always 1; the role label says what the rank does: both (a co-located rank), or prefill "
                    "or decode (--prefill, --decode)")
              .Register(*registry_),
      },
      capacity_(std::max(capacity, rank_urls.size())),
      ranks_(std::make_unique<rank_handles[]>(capacity_)),
      rank_labels_(std::make_unique<std::string[]>(capacity_)) {
  prometheus::BuildGauge()
      .Name("dplb_build_info")
      .Help("Always 1; the labels tell the version and the balancing policy")
      .Register(*registry_)
      .Add({{"version", DPLB_VERSION}, {"policy", std::string(policy_name)}})
      .Set(1);
  for (auto& band : queue_wait_by_band_) band = std::make_unique<support::atomic_histogram>(latency_buckets());
  for (const auto& url : rank_urls) add_rank(url);
}

void proxy_metrics::add_rank(const std::string& url, const std::string& cluster, config::rank_role role) {
  const std::size_t r = rank_count_.load(std::memory_order_relaxed);
  if (r >= capacity_) throw std::length_error("metrics: no room for rank " + std::to_string(r));
  const auto label = std::to_string(r);
  rank_labels_[r] = label;
  auto& f = families_;
  ranks_[r] = rank_handles{
      &f.inflight.Add({{"rank", label}, {"url", url}}),
      &f.tokens_inflight.Add({{"rank", label}}),
      &f.healthy.Add({{"rank", label}}),
      std::make_unique<support::atomic_histogram>(latency_buckets()),
      std::make_unique<support::atomic_histogram>(latency_buckets()),
      &f.prompt.Add({{"rank", label}}),
      &f.completion.Add({{"rank", label}}),
      &f.connects.Add({{"rank", label}}),
      &f.keepalive_retries.Add({{"rank", label}}),
      &f.ejected.Add({{"rank", label}}),
      &f.ejections.Add({{"rank", label}}),
      &f.draining.Add({{"rank", label}}),
      {},
      std::make_unique<std::array<std::atomic<prometheus::Counter*>, 600>>(),
  };
  for (std::size_t k = 0; k < upstream_error_kinds.size(); ++k) {
    ranks_[r].errors[k] = &f.errors.Add({{"rank", label}, {"kind", std::string(upstream_error_kinds[k])}});
  }
  ranks_[r].healthy->Set(1);
  f.cluster.Add({{"rank", label}, {"cluster", cluster}}).Set(1);
  f.role.Add({{"rank", label}, {"role", std::string(config::role_name(role))}}).Set(1);
  {
    std::lock_guard lock(render_mutex_);
    retired_.push_back(0);
  }
  rank_count_.store(r + 1, std::memory_order_release);
}

void proxy_metrics::retire_rank(std::size_t rank) {
  std::lock_guard lock(render_mutex_);
  if (rank < retired_.size()) retired_[rank] = 1;
}

void proxy_metrics::restore_rank(std::size_t rank) {
  std::lock_guard lock(render_mutex_);
  if (rank < retired_.size()) retired_[rank] = 0;
}

bool proxy_metrics::retired(std::size_t rank) const { return rank < retired_.size() && retired_[rank] != 0; }

proxy_metrics::~proxy_metrics() = default;

prometheus::Counter& proxy_metrics::status_counter(std::size_t rank, unsigned status) {
  if (status >= 600) status = 599;
  auto& slot = (*ranks_[rank].by_status)[status];
  auto* counter = slot.load(std::memory_order_acquire);
  if (!counter) {
    // First request with this status on this rank: Family::Add is thread-safe and returns the same
    // counter for the same labels, so a race here only costs a second lookup.
    counter = &requests_family_.Add({{"rank", rank_labels_[rank]}, {"code", std::to_string(status)}});
    slot.store(counter, std::memory_order_release);
  }
  return *counter;
}

void proxy_metrics::request_finished(std::size_t rank, unsigned status, std::chrono::duration<double> duration) {
  status_counter(rank, status).Increment();
  ranks_[rank].duration->observe(duration.count());
}

proxy_metrics::rank_outcomes proxy_metrics::outcomes(std::size_t rank) const {
  rank_outcomes out;
  if (rank >= rank_count()) return out;
  const auto& handles = ranks_[rank];
  for (unsigned status = 0; status < handles.by_status->size(); ++status) {
    const auto* counter = (*handles.by_status)[status].load(std::memory_order_acquire);
    if (!counter) continue;
    const auto n = static_cast<std::uint64_t>(counter->Value());
    out.responses += n;
    if (status >= 500) out.server_errors += n;
  }
  for (const auto* counter : handles.errors) out.upstream_errors += static_cast<std::uint64_t>(counter->Value());
  return out;
}

void proxy_metrics::first_byte(std::size_t rank, std::chrono::duration<double> since_pick) {
  ranks_[rank].ttfb->observe(since_pick.count());
}

void proxy_metrics::tokens(std::size_t rank, std::uint64_t prompt, std::uint64_t completion) {
  ranks_[rank].prompt_tokens->Increment(static_cast<double>(prompt));
  ranks_[rank].completion_tokens->Increment(static_cast<double>(completion));
}

void proxy_metrics::rejected(unsigned status) {
  if (status >= 600) status = 599;
  auto& slot = rejected_by_status_[status];
  auto* counter = slot.load(std::memory_order_acquire);
  if (!counter) {  // as in status_counter(): a race only costs a second lookup of the same counter
    counter = &rejected_family_.Add({{"code", std::to_string(status)}});
    slot.store(counter, std::memory_order_release);
  }
  counter->Increment();
}

void proxy_metrics::upstream_connected(std::size_t rank) { ranks_[rank].connects->Increment(); }
void proxy_metrics::keepalive_retry(std::size_t rank) { ranks_[rank].keepalive_retries->Increment(); }
void proxy_metrics::upstream_error(std::size_t rank, std::string_view kind) {
  for (std::size_t k = 0; k < upstream_error_kinds.size(); ++k) {
    if (upstream_error_kinds[k] == kind) return ranks_[rank].errors[k]->Increment();
  }
}

void proxy_metrics::retried() { retries_.Increment(); }

void proxy_metrics::rank_state(std::size_t rank, bool healthy, bool ejected) {
  ranks_[rank].healthy->Set(healthy ? 1 : 0);
  ranks_[rank].ejected->Set(ejected ? 1 : 0);
}

void proxy_metrics::ejected(std::size_t rank) { ranks_[rank].ejections->Increment(); }

void proxy_metrics::rank_draining(std::size_t rank, bool draining) { ranks_[rank].draining->Set(draining ? 1 : 0); }

void proxy_metrics::queued(std::chrono::duration<double> waited, std::int64_t priority) {
  queue_wait_.observe(waited.count());
  queue_wait_by_band_[priority < 0 ? 0 : priority == 0 ? 1 : 2]->observe(waited.count());
}

void proxy_metrics::client_connection_opened() {
  client_connections_.Increment();
  client_connections_total_.Increment();
}
void proxy_metrics::client_connection_closed() { client_connections_.Decrement(); }

std::string proxy_metrics::render() {
  // Two scrapes on two workers: one at a time, since the first scrape after a rank's first engine read
  // adds its series.
  std::lock_guard lock(render_mutex_);
  // A rank being added is in the metrics a moment before it is in the balancer: it shows from the next scrape.
  const std::size_t ranks = std::min(rank_count(), balancer_.rank_count());
  for (std::size_t r = 0; r < ranks; ++r) {
    if (retired(r)) continue;
    ranks_[r].inflight->Set(balancer_.inflight(r));
    ranks_[r].tokens_inflight->Set(static_cast<double>(balancer_.cost_inflight(r)));
    refresh_engine_stats(r);
  }
  skew_.Set(balancer_.inflight_skew());
  queue_depth_.Set(static_cast<double>(balancer_.waiting()));
  auto families = registry_->Collect();
  if (std::ranges::find(retired_, 1) != retired_.end()) {
    // A removed rank's series leave with it (its handles stay: see add_rank).
    for (auto& family : families) {
      std::erase_if(family.metric, [&](const prometheus::ClientMetric& m) {
        const auto rank = std::ranges::find(m.label, std::string("rank"), &prometheus::ClientMetric::Label::name);
        return rank != m.label.end() && retired(std::stoul(rank->value));
      });
    }
  }
  for (auto& family : histogram_families()) families.push_back(std::move(family));
  for (auto& family : routing_families()) families.push_back(std::move(family));
  for (auto& family : kv_event_families()) families.push_back(std::move(family));
  for (auto& family : shared_state_families()) families.push_back(std::move(family));
  if (tenants_ != nullptr) {
    for (auto& family : tenant_families(*tenants_)) families.push_back(std::move(family));
  }
  if (access_log_ != nullptr) {
    auto dropped = scraped_family("dplb_access_log_dropped_total",
                                  "Access log lines dropped because the queue to its writing thread was full",
                                  prometheus::MetricType::Counter);
    prometheus::ClientMetric m;
    m.counter.value = static_cast<double>(access_log_->dropped());
    dropped.metric.push_back(std::move(m));
    families.push_back(std::move(dropped));
  }
  if (supervisor_ != nullptr) {
    auto errors = scraped_family("dplb_internal_errors_total",
                                 "Exceptions that ended a background task's run (which then restarted), by task",
                                 prometheus::MetricType::Counter);
    for (std::size_t t = 0; t < support::task_names.size(); ++t) {
      prometheus::ClientMetric m;
      m.label = {{"task", std::string(support::task_names[t])}};
      m.counter.value = static_cast<double>(supervisor_->errors(static_cast<support::task>(t)));
      errors.metric.push_back(std::move(m));
    }
    families.push_back(std::move(errors));
  }
  return prometheus::TextSerializer().Serialize(families);
}

void proxy_metrics::observe_kv_events(const kv::event_index& events, bool tokenize) {
  kv_events_ = &events;
  tokenize_ = tokenize;
}

std::vector<prometheus::MetricFamily> proxy_metrics::shared_state_families() const {
  std::vector<prometheus::MetricFamily> out;
  if (ledger_ == nullptr) return out;
  const auto gauge = [](double value) {
    prometheus::ClientMetric m;
    m.gauge.value = value;
    return m;
  };
  auto up = scraped_family("dplb_shared_state_up",
                           "1 while the ledger shared with the other replicas (--shared-state) answers; 0: "
                           "requests are picked by this replica's own counts",
                           prometheus::MetricType::Gauge);
  up.metric.push_back(gauge(ledger_->up() ? 1 : 0));
  auto replicas = scraped_family("dplb_shared_state_replicas",
                                 "Live replicas in the shared ledger at its last answer, this one included",
                                 prometheus::MetricType::Gauge);
  replicas.metric.push_back(gauge(ledger_->replicas()));
  auto errors = scraped_family("dplb_shared_state_errors_total",
                               "Calls to the shared ledger that failed (no connection, timed out, refused), by "
                               "operation",
                               prometheus::MetricType::Counter);
  for (std::size_t op = 0; op < static_cast<std::size_t>(ledger::ledger_op::count); ++op) {
    prometheus::ClientMetric m;
    m.label = {{"op", std::string(ledger::ledger_op_name(static_cast<ledger::ledger_op>(op)))}};
    m.counter.value = static_cast<double>(ledger_->errors(static_cast<ledger::ledger_op>(op)));
    errors.metric.push_back(std::move(m));
  }
  auto picks = scraped_family("dplb_shared_state_pick_seconds",
                              "Round trip of each pick asked of the shared ledger, answered or not",
                              prometheus::MetricType::Histogram);
  picks.metric.push_back(histogram_sample({}, ledger_->pick_seconds()));
  out.push_back(std::move(up));
  out.push_back(std::move(errors));
  out.push_back(std::move(picks));
  out.push_back(std::move(replicas));
  return out;
}

std::vector<prometheus::MetricFamily> proxy_metrics::kv_event_families() const {
  std::vector<prometheus::MetricFamily> out;
  if (kv_events_ == nullptr) return out;
  auto events = scraped_family("dplb_kv_events_total",
                               "KV-cache events read from the rank's engine and applied to dplb's index (each "
                               "event of a batch, AllBlocksCleared included)",
                               prometheus::MetricType::Counter);
  auto errors = scraped_family("dplb_kv_event_errors_total",
                               "KV-cache events skipped: an unknown type or a wrong shape, or a whole message "
                               "that is not an EventBatch (counted once)",
                               prometheus::MetricType::Counter);
  auto blocks = scraped_family("dplb_kv_blocks", "KV-cache blocks dplb's index holds for the rank now",
                               prometheus::MetricType::Gauge);
  auto resets = scraped_family("dplb_kv_index_resets_total",
                               "Times the rank's index was dropped whole: gap (events lost, not replayed), restart "
                               "(the publisher's sequence went back), unhealthy, removed, disconnect (the publisher's "
                               "connection dropped)",
                               prometheus::MetricType::Counter);
  auto replayed = scraped_family("dplb_kv_events_replayed_total",
                                 "Event batches read from the rank's replay socket: after a sequence gap, and when dplb first hears the rank "
                                 "(or hears it again after a restart, a disconnection or an unhealthy spell)",
                                 prometheus::MetricType::Counter);
  auto lag = scraped_family("dplb_kv_event_lag_seconds",
                            "Arrival of the rank's last event batch minus the engine's timestamp on it (clocks "
                            "of two hosts: their skew adds in)",
                            prometheus::MetricType::Gauge);
  const auto sample = [](const std::string& rank, double value, prometheus::MetricType type) {
    prometheus::ClientMetric m;
    m.label = {{"rank", rank}};
    (type == prometheus::MetricType::Gauge ? m.gauge.value : m.counter.value) = value;
    return m;
  };
  const std::size_t ranks = std::min(rank_count(), kv_events_->capacity());
  for (std::size_t rank = 0; rank < ranks; ++rank) {
    const auto* feed = kv_events_->feed(rank);
    if (!feed->configured.load(std::memory_order_relaxed) && feed->events.load(std::memory_order_relaxed) == 0 &&
        feed->errors.load(std::memory_order_relaxed) == 0) {
      continue;  // never had an event source
    }
    if (retired(rank)) continue;
    const auto& label = rank_labels_[rank];
    const auto load = [](const std::atomic<std::uint64_t>& v) { return static_cast<double>(v.load(std::memory_order_relaxed)); };
    events.metric.push_back(sample(label, load(feed->events), prometheus::MetricType::Counter));
    errors.metric.push_back(sample(label, load(feed->errors), prometheus::MetricType::Counter));
    blocks.metric.push_back(sample(label, load(feed->blocks), prometheus::MetricType::Gauge));
    replayed.metric.push_back(sample(label, load(feed->replayed), prometheus::MetricType::Counter));
    for (std::size_t r = 0; r < kv::reset_reason_count; ++r) {
      auto m = sample(label, load(feed->resets[r]), prometheus::MetricType::Counter);
      m.label.push_back({"reason", std::string(kv::name_of(static_cast<kv::reset_reason>(r)))});
      resets.metric.push_back(std::move(m));
    }
    const double ts = feed->last_batch_ts.load(std::memory_order_relaxed);
    const double arrival = feed->last_batch_arrival.load(std::memory_order_relaxed);
    lag.metric.push_back(sample(label, ts > 0 ? std::max(0.0, arrival - ts) : 0.0, prometheus::MetricType::Gauge));
  }
  out.push_back(std::move(events));
  out.push_back(std::move(errors));
  out.push_back(std::move(blocks));
  out.push_back(std::move(resets));
  out.push_back(std::move(replayed));
  out.push_back(std::move(lag));
  if (tokenize_) {
    auto tokenize = scraped_family("dplb_tokenize_requests_total",
                                   "--tokenize engine: /tokenize asked of an engine for a request's text, by outcome "
                                   "(failed: the request was matched without its token ids)",
                                   prometheus::MetricType::Counter);
    for (std::size_t i = 0; i < 2; ++i) {
      prometheus::ClientMetric m;
      m.label = {{"outcome", i == 0 ? "ok" : "failed"}};
      m.counter.value = static_cast<double>(tokenize_outcomes_[i].load(std::memory_order_relaxed));
      tokenize.metric.push_back(std::move(m));
    }
    out.push_back(std::move(tokenize));
  }
  return out;
}

void proxy_metrics::observe_routing(const balancer::routing_stats& stats, bool prefix, bool affinity) {
  routing_ = &stats;
  routing_prefix_ = prefix;
  routing_affinity_ = affinity;
}

std::vector<prometheus::MetricFamily> proxy_metrics::routing_families() const {
  std::vector<prometheus::MetricFamily> out;
  if (routing_ == nullptr) return out;
  const auto counter = [](std::string outcome, const std::atomic<std::uint64_t>& value) {
    prometheus::ClientMetric m;
    m.label = {{"outcome", std::move(outcome)}};
    m.counter.value = static_cast<double>(value.load(std::memory_order_relaxed));
    return m;
  };
  const auto& r = *routing_;
  if (routing_prefix_) {
    auto decisions = scraped_family("dplb_prefix_decisions_total",
                            "prefix-aware picks: taken (sent where the longest prefix went), overridden (that rank "
                            "was over --load-bound) or missed (no match of --prefix-min-match)",
                            prometheus::MetricType::Counter);
    decisions.metric = {counter("taken", r.prefix_taken), counter("overridden", r.prefix_overridden),
                        counter("missed", r.prefix_missed)};
    out.push_back(std::move(decisions));
    auto matched = scraped_family("dplb_prefix_matched_tokens",
                          "prefix-aware picks: the longest prefix of the prompt some rank was sent before, in "
                          "estimated tokens",
                          prometheus::MetricType::Histogram);
    matched.metric.push_back(histogram_sample({}, r.matched_tokens));
    out.push_back(std::move(matched));
    auto index = scraped_family("dplb_prefix_index_blocks",
                        "prefix-aware: prompt blocks (256 bytes, about 64 tokens, each) remembered for the rank",
                        prometheus::MetricType::Gauge);
    const std::size_t ranks = std::min(rank_count(), r.capacity);
    for (std::size_t rank = 0; rank < ranks; ++rank) {
      if (retired(rank)) continue;
      prometheus::ClientMetric g;
      g.label = {{"rank", rank_labels_[rank]}};
      g.gauge.value = static_cast<double>(r.index_blocks[rank].load(std::memory_order_relaxed));
      index.metric.push_back(std::move(g));
    }
    out.push_back(std::move(index));
  }
  if (routing_affinity_) {
    auto decisions = scraped_family("dplb_affinity_decisions_total",
                            "Requests with --affinity-header: taken (sent to their session's rank) or overridden "
                            "(it was over --load-bound: the next rank on the ring took it)",
                            prometheus::MetricType::Counter);
    decisions.metric = {counter("taken", r.affinity_taken), counter("overridden", r.affinity_overridden)};
    out.push_back(std::move(decisions));
  }
  return out;
}

void proxy_metrics::refresh_engine_stats(std::size_t rank) {
  const auto stats = balancer_.engine_stats_of(rank);
  if (!stats.ever) return;
  auto& h = ranks_[rank];
  if (!h.engine_running) {  // render_mutex_ is held
    const prometheus::Labels labels{{"rank", rank_labels_[rank]}};
    h.engine_running = &engine_running_.Add(labels);
    h.engine_waiting = &engine_waiting_.Add(labels);
    h.engine_kv_cache_usage = &engine_kv_cache_usage_.Add(labels);
    h.engine_stats_age = &engine_stats_age_.Add(labels);
  }
  h.engine_running->Set(stats.load.running);
  h.engine_waiting->Set(stats.load.waiting);
  h.engine_kv_cache_usage->Set(stats.load.kv_cache_usage);
  h.engine_stats_age->Set(std::chrono::duration<double>(stats.age).count());
}

std::vector<prometheus::MetricFamily> proxy_metrics::histogram_families() const {
  const auto family = [](std::string name, std::string help) {
    return scraped_family(std::move(name), std::move(help), prometheus::MetricType::Histogram);
  };
  auto duration = family("dplb_request_duration_seconds", "From the pick of a rank to the end of the relayed response");
  auto ttfb = family("dplb_time_to_first_byte_seconds",
                     "From the pick of a rank to the arrival of the engine's response head");
  const std::size_t ranks = rank_count();
  for (std::size_t r = 0; r < ranks; ++r) {
    if (retired(r)) continue;
    duration.metric.push_back(histogram_sample({{"rank", rank_labels_[r]}}, *ranks_[r].duration));
    ttfb.metric.push_back(histogram_sample({{"rank", rank_labels_[r]}}, *ranks_[r].ttfb));
  }
  auto queue_wait = family("dplb_queue_wait_seconds",
                           "Time requests waited in dplb's queue, whether they then got a slot or not");
  queue_wait.metric.push_back(histogram_sample({}, queue_wait_));
  auto by_band = family("dplb_queue_wait_by_priority_seconds",
                        "Time requests waited in dplb's queue, by the band of their priority: high (below 0), "
                        "normal (0, or none), low (above 0)");
  for (std::size_t b = 0; b < priority_bands.size(); ++b) {
    by_band.metric.push_back(histogram_sample({{"band", std::string(priority_bands[b])}}, *queue_wait_by_band_[b]));
  }
  std::vector<prometheus::MetricFamily> out{std::move(duration), std::move(ttfb), std::move(queue_wait),
                                            std::move(by_band)};
  if (disaggregated_) {
    auto legs = family("dplb_pd_leg_duration_seconds",
                       "Each leg of a two-leg request: prefill from its sending to its whole answer, decode from "
                       "its sending to the end of its response");
    legs.metric.push_back(histogram_sample({{"leg", "prefill"}}, prefill_leg_));
    legs.metric.push_back(histogram_sample({{"leg", "decode"}}, decode_leg_));
    out.push_back(std::move(legs));
    auto skipped = scraped_family("dplb_pd_prefill_skipped_total",
                                  "Requests run in one leg on a decode rank that held their prompt "
                                  "(--pd-skip-prefill-ratio)",
                                  prometheus::MetricType::Counter);
    prometheus::ClientMetric m;
    m.counter.value = static_cast<double>(prefill_skipped_.load(std::memory_order_relaxed));
    skipped.metric.push_back(std::move(m));
    out.push_back(std::move(skipped));
  }
  return out;
}

}  // namespace dplb::metrics
