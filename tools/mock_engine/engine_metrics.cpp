#include "engine_metrics.hpp"

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

class text_writer {
 public:
  text_writer(std::string_view engine, std::string_view model_name) : engine_(engine), model_(model_name) {}

  void family(std::string_view name, std::string_view type, std::string_view help) {
    out_.append("# HELP ").append(name).append(" ").append(help).append("\n");
    out_.append("# TYPE ").append(name).append(" ").append(type).append("\n");
  }

  // name{engine="..",<extra_label>,model_name=".."} value; extra_label sorts between the two.
  void vllm_sample(std::string_view name, std::int64_t value, std::string_view extra_label = {}) {
    out_.append(name).append("{engine=\"");
    append_label_value(out_, engine_);
    out_.append("\",");
    if (!extra_label.empty()) out_.append(extra_label).append(",");
    out_.append("model_name=\"");
    append_label_value(out_, model_);
    out_.append("\"} ");
    append_value(value);
  }

  void mock_sample(std::string_view name, std::int64_t value) {
    out_.append(name).append("{engine=\"");
    append_label_value(out_, engine_);
    out_.append("\"} ");
    append_value(value);
  }

  // A nanosecond count, printed in seconds.
  void mock_seconds(std::string_view name, std::int64_t nanoseconds) {
    out_.append(name).append("{engine=\"");
    append_label_value(out_, engine_);
    out_.append("\"} ");
    char text[32];
    const int n = std::snprintf(text, sizeof text, "%.9f\n", static_cast<double>(nanoseconds) / 1e9);
    out_.append(text, static_cast<std::size_t>(n));
  }

  // A whole series (its HELP and TYPE lines, then its one sample), naming it once.
  void vllm_series(std::string_view name, std::string_view type, std::string_view help, std::int64_t value,
                   std::string_view extra_label = {}) {
    family(name, type, help);
    vllm_sample(name, value, extra_label);
  }
  void mock_series(std::string_view name, std::string_view type, std::string_view help, std::int64_t value) {
    family(name, type, help);
    mock_sample(name, value);
  }
  void mock_seconds_counter(std::string_view name, std::string_view help, std::int64_t nanoseconds) {
    family(name, "counter", help);
    mock_seconds(name, nanoseconds);
  }

  std::string take() { return std::move(out_); }

 private:
  void append_value(std::int64_t value) { out_.append(std::to_string(value)).append(".0\n"); }

  std::string_view engine_;
  std::string_view model_;
  std::string out_;
};

std::int64_t load(const std::atomic<std::uint64_t>& counter) {
  return static_cast<std::int64_t>(counter.load(std::memory_order_relaxed));
}

std::int64_t load(const std::atomic<std::int64_t>& gauge) { return gauge.load(std::memory_order_relaxed); }

}  // namespace

std::string render_metrics(const engine_metrics& m, std::string_view engine, std::string_view model_name) {
  text_writer w(engine, model_name);
  w.vllm_series("vllm:num_requests_running", "gauge", "Number of requests in model execution batches.",
                load(m.requests_running));
  // Without --simulate every admitted request runs at once, and this stays 0.
  w.vllm_series("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.",
                load(m.requests_waiting));
  w.vllm_series("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.", 0);
  w.vllm_series("vllm:prompt_tokens_total", "counter", "Number of prefill tokens processed.", load(m.prompt_tokens));
  w.vllm_series("vllm:generation_tokens_total", "counter", "Number of generation tokens processed.",
                load(m.generation_tokens));
  w.vllm_series("vllm:request_success_total", "counter", "Count of successfully processed requests.",
                load(m.requests_succeeded), "finished_reason=\"length\"");

  w.mock_series("mock_requests_received_total", "counter",
                "Requests whose head reached this rank (any path but /metrics), dropped and reset ones included.",
                load(m.requests_received));
  w.mock_series("mock_requests_aborted_total", "counter",
                "Generation and /mock/stream requests whose client went away before the end.",
                load(m.requests_aborted));
  w.mock_series("mock_requests_dropped_total", "counter", "Requests closed unanswered by --close-on-request.",
                load(m.requests_dropped));
  w.mock_series("mock_requests_reset_total", "counter",
                "Requests whose connection was reset (RST) by the reset_on_request or reset_after_events fault.",
                load(m.requests_reset));
  w.mock_series("mock_health_checks_total", "counter", "GET and HEAD /health requests received.",
                load(m.health_checks));
  w.mock_series("mock_metrics_scrapes_total", "counter",
                "GET /metrics requests received on the rank's own port (a balancer reading engine stats).",
                load(m.metrics_scrapes));
  w.mock_series("mock_connections_accepted_total", "counter", "Connections accepted.", load(m.connections_accepted));
  w.mock_series("mock_connections_open", "gauge", "Connections open now.", load(m.connections_open));
  w.mock_series("mock_connections_closed_by_fault_total", "counter",
                "Open connections closed by the \"listening\": false fault.", load(m.connections_closed_by_fault));
  if (m.simulated) {
    w.mock_series("mock_steps_total", "counter", "Simulated engine steps run, dummy steps included.",
                  load(m.sim_steps));
    w.mock_series("mock_padded_tokens_total", "counter",
                  "Sum over steps of the CUDA-graph-padded batch this rank ran (under lockstep, the group's).",
                  load(m.sim_padded_tokens));
    w.mock_series("mock_real_tokens_total", "counter", "Sum over steps of the requests this rank scheduled.",
                  load(m.sim_real_tokens));
    w.mock_seconds_counter("mock_step_seconds_total", "Simulated seconds spent in steps.", load(m.sim_step_ns));
    w.mock_seconds_counter("mock_step_lag_seconds_total",
                           "Wall seconds between each step's due end and its handling, summed: the event loop's delay.",
                           load(m.sim_lag_ns));
  }
  return w.take();
}

}  // namespace dplb::mock
