#pragma once
// The reader of a vLLM /metrics page (Prometheus text format 0.0.4), a pure function of the page's text.
//
// The lines they take: `name value [timestamp]` or `name{label="value",...} value [timestamp]`, blanks
// (spaces, tabs) between the parts, LF or CRLF line ends; comments (`# HELP`, `# TYPE`) and blank lines
// are skipped. A name matches exactly: vllm:num_requests_running_total is not vllm:num_requests_running.
// A value is a decimal or exponent float (`3.0`, `1e3`, `+2`); NaN, +Inf, -Inf, negatives, and a value
// with anything but blanks and a timestamp after it are ignored. The reader never throws, and runs in time
// linear in the page.

#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "dplb/balancer/policy.hpp"

namespace dplb::upstream {

// The largest engine label parse_engine_samples() takes: vLLM numbers engines by their global DP rank, and
// a bound keeps a hostile page from making it allocate per label value.
inline constexpr std::uint32_t max_engine_label = 4095;

// One DP engine's numbers as its /metrics page reports them. One vLLM server with internal DP shows
// engine="0".."N-1" on one page; an external-LB server shows its own global rank (a one-rank server may
// show engine="3").
struct engine_sample {
  std::uint32_t engine = 0;              // the engine label's value
  double running = 0, waiting = 0;       // summed over the engine's series (e.g. several model_name)
  std::optional<double> kv_cache_usage;  // 0..1, the max over the engine's series; nullopt when absent
  bool has_counts = false;               // saw running or waiting for this engine

  bool operator==(const engine_sample&) const = default;
};

// Per engine, sorted by engine, one entry per engine label seen in a usable series of
// vllm:num_requests_running, vllm:num_requests_waiting, vllm:kv_cache_usage_perc or (its older name,
// used only for an engine without the newer one) vllm:gpu_cache_usage_perc. A series without an engine
// label is engine 0; one whose engine label is not a decimal integer in [0, max_engine_label], or whose
// label set cannot be read, is ignored. KV cache usage above 1 counts as 1. Empty when the page has no
// usable series.
std::vector<engine_sample> parse_engine_samples(std::string_view prometheus_text);

// One engine's sample as the balancer takes it: counts rounded to whole requests (and capped at
// 4e9), the KV-cache usage 0 when the page had none.
balancer::engine_load load_of(const engine_sample& sample);

}  // namespace dplb::upstream
