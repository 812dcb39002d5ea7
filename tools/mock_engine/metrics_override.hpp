#pragma once
// The admin port's /metrics/override body: gauges a test imposes on one engine's /metrics, so that a
// balancer's reading of engine load can be tested with exact values. Pure (JSON in, JSON out).
//
//   {"running":5,"waiting":7,"kv_cache_usage":0.9}   any subset; a field set to null goes back to the
//                                                    engine's real value; absent fields are unchanged

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>

#include "engine_metrics.hpp"

namespace dplb::mock {

struct gauge_override_patch {
  // Outer empty: unchanged; inner empty: cleared (JSON null).
  std::optional<std::optional<std::int64_t>> running;
  std::optional<std::optional<std::int64_t>> waiting;
  std::optional<std::optional<double>> kv_cache_usage;
};

// running and waiting: integers >= 0; kv_cache_usage: a number >= 0 (above 1 allowed: a test may want
// an impossible value); null clears. An empty body is {}. On failure, a one-line reason.
std::variant<gauge_override_patch, std::string> parse_gauge_override_patch(std::string_view body);

gauge_overrides patched(gauge_overrides overrides, const gauge_override_patch& patch);

// {"running":5,"waiting":null,"kv_cache_usage":0.9}: null where the real value shows.
std::string render_gauge_overrides(const gauge_overrides& overrides);

}  // namespace dplb::mock
