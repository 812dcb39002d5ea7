#pragma once
// A port's and its engines' counters, shared by every event-loop thread (relaxed atomics: each value is
// read alone), and their rendering as vLLM-like Prometheus text.

#include <atomic>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace dplb::mock {

// What a port counts, whatever engine serves: connections and request heads, the transport's side.
struct port_metrics {
  std::atomic<std::uint64_t> requests_received{0};  // every request head read, except GET /metrics
  std::atomic<std::uint64_t> requests_dropped{0};   // closed unanswered by --close-on-request
  // Reset (RST) by the reset_on_request or reset_after_events fault: neither a success nor an abort.
  std::atomic<std::uint64_t> requests_reset{0};
  std::atomic<std::uint64_t> health_checks{0};    // GET or HEAD /health received, whatever the answer
  std::atomic<std::uint64_t> metrics_scrapes{0};  // GET /metrics on the rank's port (not the admin's)
  std::atomic<std::uint64_t> connections_accepted{0};
  std::atomic<std::int64_t> connections_open{0};
  // Closed by the "listening": false fault; a request running on one is neither a success nor an abort.
  std::atomic<std::uint64_t> connections_closed_by_fault{0};
};

// One DP engine's counters (one per port with --dp 1).
struct engine_metrics {
  // vLLM's series (vllm:*), with the same meaning as in vLLM.
  // Generating now (vllm:num_requests_running); with --simulate, the scheduler's running requests.
  std::atomic<std::int64_t> requests_running{0};
  // Queued, not admitted yet (vllm:num_requests_waiting): the scheduler's, 0 without --simulate.
  std::atomic<std::int64_t> requests_waiting{0};
  // vllm:kv_cache_usage_perc in [0, 1]: with --simulate the KV blocks held over --kv-blocks
  // (sim_engine), else 0.
  std::atomic<double> kv_cache_usage{0};
  // vllm:prefix_cache_queries_total / _hits_total (tokens) and vllm:num_preemptions_total: the
  // simulated scheduler's, 0 without --simulate.
  std::atomic<std::uint64_t> prefix_queries{0};
  std::atomic<std::uint64_t> prefix_hits{0};
  std::atomic<std::uint64_t> preemptions{0};
  std::atomic<std::uint64_t> prompt_tokens{0};       // vllm:prompt_tokens_total, added at admission
  std::atomic<std::uint64_t> generation_tokens{0};   // vllm:generation_tokens_total, per token
  std::atomic<std::uint64_t> requests_succeeded{0};  // vllm:request_success_total{finished_reason="length"}
  // The mock's own (mock_*): what the tests need to see from the engine's side.
  std::atomic<std::uint64_t> requests_aborted{0};  // the client went away before the end
  // Completions/chat requests given to this engine (after the X-data-parallel-rank check, before the
  // faults and validation), and how many of them named it in X-data-parallel-rank.
  std::atomic<std::uint64_t> requests_routed{0};
  std::atomic<std::uint64_t> requests_routed_by_header{0};
  // Completions/chat requests given to this engine and not answered yet: what the port balances on.
  std::atomic<std::int64_t> requests_in_flight{0};

  // Simulated serving (--simulate; see sim_engine.hpp). Set once at start-up, before any thread runs:
  // the mock_* series below are rendered only then, and requests_running/_waiting come from the
  // scheduler (a generation_tracker then leaves them alone).
  bool simulated = false;
  std::atomic<std::uint64_t> sim_steps{0};          // mock_steps_total: steps run, dummy ones included
  std::atomic<std::uint64_t> sim_padded_tokens{0};  // mock_padded_tokens_total: sum of padded batches
  std::atomic<std::uint64_t> sim_even_padded_tokens{0};  // mock_even_padded_tokens_total: their floor
  std::atomic<std::uint64_t> sim_real_tokens{0};    // mock_real_tokens_total: sum of real batches
  std::atomic<std::uint64_t> sim_step_ns{0};        // mock_step_seconds_total, in simulated nanoseconds
  std::atomic<std::uint64_t> sim_lag_ns{0};         // mock_step_lag_seconds_total, in wall nanoseconds
  // The scheduler's outstanding work (waiting and running requests): mock_prompt_tokens_pending (not yet
  // prefilled) and mock_decode_tokens_pending (not yet produced).
  std::atomic<std::uint64_t> sim_prompt_pending{0};
  std::atomic<std::uint64_t> sim_decode_pending{0};
  std::atomic<std::uint64_t> sim_kv_tokens{0};  // mock_kv_tokens: tokens whose KV the running requests hold
  // The cache's shape, for vllm:cache_config_info (set with `simulated`).
  std::uint32_t kv_block_size = 0;
  std::uint32_t kv_blocks = 0;
  bool prefix_caching = false;

  // KV-cache events (--kv-events-port; kv_event_publisher.hpp). `kv_events` is set once at start-up; the
  // counters are the publisher thread's: events in the batches it sent, and batches dropped because its
  // queue was full (their sequence numbers skipped).
  bool kv_events = false;
  std::atomic<std::uint64_t> kv_events_published{0};
  std::atomic<std::uint64_t> kv_batches_dropped{0};

  // Prefill/decode disaggregation (--kv-role prefill or decode; kv_transfer.hpp). `kv_transfer` is set
  // once at start-up; the series are rendered only then. Decode side: blocks pulled successfully
  // (mock_kv_transfers_total) and pulls that failed (mock_kv_transfer_errors_total); prefill side: blocks
  // held for a pull now (mock_kv_blocks_held) and holds freed by the timeout (mock_kv_holds_expired_total).
  bool kv_transfer = false;
  std::atomic<std::uint64_t> kv_transfers{0};
  std::atomic<std::uint64_t> kv_transfer_errors{0};
  std::atomic<std::int64_t> kv_blocks_held{0};
  std::atomic<std::uint64_t> kv_holds_expired{0};
};

// Values a test imposes on an engine's gauges (the admin port's /metrics/override); unset: the real one.
struct gauge_overrides {
  std::optional<std::int64_t> running;  // vllm:num_requests_running
  std::optional<std::int64_t> waiting;  // vllm:num_requests_waiting
  std::optional<double> kv_cache_usage;  // vllm:kv_cache_usage_perc

  bool operator==(const gauge_overrides&) const = default;
};

// One engine as /metrics shows it.
struct engine_view {
  const engine_metrics& metrics;
  std::string_view label;  // its engine="..." value
  gauge_overrides overrides;
};

// The /metrics body (content type text/plain; version=0.0.4) of a port serving `model_name`: every
// per-engine series once per engine, labelled engine="<label>"; the port's own series (connections,
// request heads, health checks, scrapes) labelled engine="<port_label>", or with no label when
// port_label is empty (a port of several engines: they count the port, not an engine). Labels print in
// alphabetical order and values as floats ("3.0"), as vLLM's prometheus_client does.
std::string render_metrics(const port_metrics& port, std::string_view port_label,
                           const std::vector<engine_view>& engines, std::string_view model_name);

// Follows one admitted generation request through the metrics: running while it generates, then
// exactly one of success (finish()), ended by a fault (end_by_fault(): counted where the fault
// counts it) or aborted (destroyed unfinished, e.g. the client went away).
// finish() comes before the last bytes are written, as in vLLM where the engine finishes the request
// before the API server sends the end: a client that saw the end then sees the counts.
class generation_tracker {
 public:
  generation_tracker(engine_metrics& metrics, std::uint64_t prompt_tokens)
      : metrics_(metrics), counts_running_(!metrics.simulated) {
    if (counts_running_) metrics_.requests_running.fetch_add(1, std::memory_order_relaxed);
    metrics_.prompt_tokens.fetch_add(prompt_tokens, std::memory_order_relaxed);
  }
  generation_tracker(const generation_tracker&) = delete;
  generation_tracker& operator=(const generation_tracker&) = delete;
  ~generation_tracker() {
    if (!finished_) {
      metrics_.requests_aborted.fetch_add(1, std::memory_order_relaxed);
      if (counts_running_) metrics_.requests_running.fetch_sub(1, std::memory_order_relaxed);
    }
  }

  void tokens(std::uint64_t n) { metrics_.generation_tokens.fetch_add(n, std::memory_order_relaxed); }

  void finish() {
    if (finished_) return;
    finished_ = true;
    metrics_.requests_succeeded.fetch_add(1, std::memory_order_relaxed);
    if (counts_running_) metrics_.requests_running.fetch_sub(1, std::memory_order_relaxed);
  }

  // The request was cut by an injected fault: it stops running and counts as neither success nor abort.
  void end_by_fault() {
    if (finished_) return;
    finished_ = true;
    if (counts_running_) metrics_.requests_running.fetch_sub(1, std::memory_order_relaxed);
  }

  bool finished() const { return finished_; }

 private:
  engine_metrics& metrics_;
  const bool counts_running_;  // false with --simulate: the scheduler owns the running gauge
  bool finished_ = false;
};

// Counts one accepted connection as open for its lifetime.
class open_connection {
 public:
  explicit open_connection(port_metrics& metrics) : metrics_(metrics) {
    metrics_.connections_accepted.fetch_add(1, std::memory_order_relaxed);
    metrics_.connections_open.fetch_add(1, std::memory_order_relaxed);
  }
  open_connection(const open_connection&) = delete;
  open_connection& operator=(const open_connection&) = delete;
  ~open_connection() { metrics_.connections_open.fetch_sub(1, std::memory_order_relaxed); }

 private:
  port_metrics& metrics_;
};

// Counts a completions/chat request in its engine's in-flight gauge for the claim's lifetime.
class in_flight_claim {
 public:
  explicit in_flight_claim(engine_metrics& metrics) : metrics_(metrics) {
    metrics_.requests_in_flight.fetch_add(1, std::memory_order_relaxed);
  }
  in_flight_claim(const in_flight_claim&) = delete;
  in_flight_claim& operator=(const in_flight_claim&) = delete;
  ~in_flight_claim() { metrics_.requests_in_flight.fetch_sub(1, std::memory_order_relaxed); }

 private:
  engine_metrics& metrics_;
};

}  // namespace dplb::mock
