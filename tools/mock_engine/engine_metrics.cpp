#include "engine_metrics.hpp"

#include <charconv>
#include <cmath>
#include <cstdio>

namespace dplb::mock {
namespace {

// Prometheus label values escape backslash, double quote and newline.
void append_label_value(std::string& out, std::string_view value) {
  for (const char c : value) {
    if (c == '\\' || c == '"') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
}

// Sample values as prometheus_client prints them: Python's repr of a float ("3.0", "0.25", "1e-05").
std::string real(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  char text[32];
  const auto end = std::to_chars(text, text + sizeof text, value).ptr;
  std::string out(text, end);
  if (out.find_first_of(".e") == std::string::npos) out += ".0";
  return out;
}

std::string integer(std::int64_t value) { return std::to_string(value) + ".0"; }

// A nanosecond count, printed in seconds.
std::string seconds(std::uint64_t nanoseconds) {
  char text[32];
  const int n = std::snprintf(text, sizeof text, "%.9f", static_cast<double>(nanoseconds) / 1e9);
  return {text, static_cast<std::size_t>(n)};
}

std::int64_t load(const std::atomic<std::uint64_t>& counter) {
  return static_cast<std::int64_t>(counter.load(std::memory_order_relaxed));
}

std::int64_t load(const std::atomic<std::int64_t>& gauge) { return gauge.load(std::memory_order_relaxed); }

// Writes families in the order asked; each family's samples follow its HELP and TYPE lines, one per
// engine for the per-engine series, so that a port of N engines is one valid exposition.
class text_writer {
 public:
  text_writer(std::string_view port_label, const std::vector<engine_view>& engines, std::string_view model_name)
      : port_label_(port_label), engines_(engines), model_(model_name) {}

  // name{engine="..",<extra_label>,model_name=".."} per engine; extra_label sorts between the two.
  template <class Value>
  void vllm_series(std::string_view name, std::string_view type, std::string_view help, Value value_of,
                   std::string_view extra_label = {}) {
    family(name, type, help);
    for (const auto& engine : engines_) {
      out_.append(name).append("{engine=\"");
      append_label_value(out_, engine.label);
      out_.append("\",");
      if (!extra_label.empty()) out_.append(extra_label).append(",");
      out_.append("model_name=\"");
      append_label_value(out_, model_);
      out_.append("\"} ").append(value_of(engine)).append("\n");
    }
  }

  // name{engine=".."} per engine.
  template <class Value>
  void engine_series(std::string_view name, std::string_view type, std::string_view help, Value value_of) {
    family(name, type, help);
    for (const auto& engine : engines_) sample(name, engine.label, value_of(engine));
  }

  // name{engine="<port label>"}, or name alone without a port label.
  void port_series(std::string_view name, std::string_view type, std::string_view help, std::int64_t value) {
    family(name, type, help);
    sample(name, port_label_, integer(value));
  }

  // vllm:cache_config_info{block_size,enable_prefix_caching,engine,num_gpu_blocks} 1 per engine: the
  // cache's shape as labels, as vLLM exports it (vLLM has more labels: dtype, memory fraction, ...).
  void cache_config_info() {
    family("vllm:cache_config_info", "gauge", "Information of the LLMEngine CacheConfig");
    for (const auto& engine : engines_) {
      const auto& m = engine.metrics;
      out_.append("vllm:cache_config_info{block_size=\"").append(std::to_string(m.kv_block_size));
      out_.append("\",enable_prefix_caching=\"").append(m.prefix_caching ? "True" : "False");
      out_.append("\",engine=\"");
      append_label_value(out_, engine.label);
      out_.append("\",num_gpu_blocks=\"").append(std::to_string(m.kv_blocks)).append("\"} 1.0\n");
    }
  }

  std::string take() { return std::move(out_); }

 private:
  void family(std::string_view name, std::string_view type, std::string_view help) {
    out_.append("# HELP ").append(name).append(" ").append(help).append("\n");
    out_.append("# TYPE ").append(name).append(" ").append(type).append("\n");
  }

  void sample(std::string_view name, std::string_view engine, const std::string& value) {
    out_.append(name);
    if (!engine.empty()) {
      out_.append("{engine=\"");
      append_label_value(out_, engine);
      out_.append("\"}");
    }
    out_.append(" ").append(value).append("\n");
  }

  std::string_view port_label_;
  const std::vector<engine_view>& engines_;
  std::string_view model_;
  std::string out_;
};

// An engine counter as a sample value.
template <class Counter>
auto counted(Counter engine_metrics::*member) {
  return [member](const engine_view& e) { return integer(load(e.metrics.*member)); };
}

}  // namespace

std::string render_metrics(const port_metrics& p, std::string_view port_label,
                           const std::vector<engine_view>& engines, std::string_view model_name) {
  text_writer w(port_label, engines, model_name);
  w.vllm_series("vllm:num_requests_running", "gauge", "Number of requests in model execution batches.",
                [](const engine_view& e) {
                  return integer(e.overrides.running.value_or(load(e.metrics.requests_running)));
                });
  // Without --simulate every admitted request runs at once, and this stays 0.
  w.vllm_series("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.",
                [](const engine_view& e) {
                  return integer(e.overrides.waiting.value_or(load(e.metrics.requests_waiting)));
                });
  w.vllm_series("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.",
                [](const engine_view& e) {
                  return real(e.overrides.kv_cache_usage.value_or(
                      e.metrics.kv_cache_usage.load(std::memory_order_relaxed)));
                });
  w.vllm_series("vllm:prefix_cache_queries_total", "counter",
                "Prefix cache queries, in terms of number of queried tokens.",
                counted(&engine_metrics::prefix_queries));
  w.vllm_series("vllm:prefix_cache_hits_total", "counter", "Prefix cache hits, in terms of number of cached tokens.",
                counted(&engine_metrics::prefix_hits));
  w.vllm_series("vllm:num_preemptions_total", "counter", "Cumulative number of preemption from the engine.",
                counted(&engine_metrics::preemptions));
  w.vllm_series("vllm:prompt_tokens_total", "counter", "Number of prefill tokens processed.",
                counted(&engine_metrics::prompt_tokens));
  w.vllm_series("vllm:generation_tokens_total", "counter", "Number of generation tokens processed.",
                counted(&engine_metrics::generation_tokens));
  w.vllm_series("vllm:request_success_total", "counter", "Count of successfully processed requests.",
                counted(&engine_metrics::requests_succeeded), "finished_reason=\"length\"");

  w.port_series("mock_requests_received_total", "counter",
                "Requests whose head reached this rank (any path but /metrics), dropped and reset ones included.",
                load(p.requests_received));
  w.engine_series("mock_requests_aborted_total", "counter",
                  "Generation and /mock/stream requests whose client went away before the end.",
                  counted(&engine_metrics::requests_aborted));
  w.port_series("mock_requests_dropped_total", "counter", "Requests closed unanswered by --close-on-request.",
                load(p.requests_dropped));
  w.port_series("mock_requests_reset_total", "counter",
                "Requests whose connection was reset (RST) by the reset_on_request or reset_after_events fault.",
                load(p.requests_reset));
  w.port_series("mock_health_checks_total", "counter", "GET and HEAD /health requests received.",
                load(p.health_checks));
  w.port_series("mock_metrics_scrapes_total", "counter",
                "GET /metrics requests received on the rank's own port (a balancer reading engine stats).",
                load(p.metrics_scrapes));
  w.port_series("mock_connections_accepted_total", "counter", "Connections accepted.", load(p.connections_accepted));
  w.port_series("mock_connections_open", "gauge", "Connections open now.", load(p.connections_open));
  w.port_series("mock_connections_closed_by_fault_total", "counter",
                "Open connections closed by the \"listening\": false fault.", load(p.connections_closed_by_fault));
  w.engine_series("mock_requests_routed_total", "counter",
                  "Completions and chat requests given to this engine (X-data-parallel-rank or the port's balancing).",
                  counted(&engine_metrics::requests_routed));
  w.engine_series("mock_requests_routed_by_header_total", "counter",
                  "Completions and chat requests that named this engine in X-data-parallel-rank.",
                  counted(&engine_metrics::requests_routed_by_header));
  if (!engines.empty() && engines.front().metrics.simulated) {
    w.cache_config_info();
    w.engine_series("mock_kv_tokens", "gauge", "Tokens whose KV the running requests hold (computed or found cached), summed over requests.",
                    counted(&engine_metrics::sim_kv_tokens));
    w.engine_series("mock_steps_total", "counter", "Simulated engine steps run, dummy steps included.",
                    counted(&engine_metrics::sim_steps));
    w.engine_series("mock_padded_tokens_total", "counter",
                    "Sum over steps of the CUDA-graph-padded batch this rank ran (under lockstep, the group's).",
                    counted(&engine_metrics::sim_padded_tokens));
    w.engine_series("mock_even_padded_tokens_total", "counter",
                    "Sum over steps of the padded batch this rank would have run had its lockstep group's sequences of "
                    "the step been split evenly over the group's ranks: the floor of mock_padded_tokens_total for "
                    "that load, whoever placed it.",
                    counted(&engine_metrics::sim_even_padded_tokens));
    w.engine_series("mock_real_tokens_total", "counter", "Sum over steps of the requests this rank scheduled.",
                    counted(&engine_metrics::sim_real_tokens));
    w.engine_series("mock_step_seconds_total", "counter", "Simulated seconds spent in steps.",
                    [](const engine_view& e) { return seconds(e.metrics.sim_step_ns.load(std::memory_order_relaxed)); });
    w.engine_series(
        "mock_step_lag_seconds_total", "counter",
        "Wall seconds between each step's due end and its handling, summed: the event loop's delay.",
        [](const engine_view& e) { return seconds(e.metrics.sim_lag_ns.load(std::memory_order_relaxed)); });
    w.engine_series("mock_prompt_tokens_pending", "gauge",
                    "Prompt tokens of the waiting and running requests not yet prefilled.",
                    counted(&engine_metrics::sim_prompt_pending));
    w.engine_series("mock_decode_tokens_pending", "gauge",
                    "Tokens the waiting and running requests have still to produce (max_tokens minus produced).",
                    counted(&engine_metrics::sim_decode_pending));
  }
  if (!engines.empty() && engines.front().metrics.kv_events) {
    w.engine_series("mock_kv_events_published_total", "counter",
                    "KV-cache events handed to this engine's ZMQ publisher (--kv-events-port).",
                    counted(&engine_metrics::kv_events_published));
    w.engine_series("mock_kv_event_batches_dropped_total", "counter",
                    "KV-cache event batches dropped because the publisher's queue was full (their sequence numbers are skipped).",
                    counted(&engine_metrics::kv_batches_dropped));
  }
  if (!engines.empty() && engines.front().metrics.kv_transfer) {
    w.engine_series("mock_kv_transfers_total", "counter",
                    "Decode: requests whose KV blocks were pulled from a prefill engine.",
                    counted(&engine_metrics::kv_transfers));
    w.engine_series("mock_kv_transfer_errors_total", "counter",
                    "Decode: requests whose KV pull failed (unknown or already read, prefill unreachable).",
                    counted(&engine_metrics::kv_transfer_errors));
    w.engine_series("mock_kv_blocks_held", "gauge", "Prefill: KV blocks held for a decode engine to pull.",
                    counted(&engine_metrics::kv_blocks_held));
    w.engine_series("mock_kv_holds_expired_total", "counter",
                    "Prefill: holds freed unread after --kv-hold-timeout-ms.",
                    counted(&engine_metrics::kv_holds_expired));
  }
  return w.take();
}

}  // namespace dplb::mock
