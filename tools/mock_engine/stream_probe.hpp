#pragma once
// /mock/stream: a plain SSE stream with server timestamps, for relay-timing tests that need no
// OpenAI semantics.

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace dplb::mock {

struct stream_probe_params {
  std::uint64_t events = 10;              // data events before [DONE]
  std::chrono::milliseconds interval{0};  // between two events; the first is sent at once
  std::size_t bytes = 0;                  // target size of one event, padding included (0: no pad)
};

// Parses "events=N&interval_ms=M&bytes=B" (any subset, any order; unknown keys ignored).
// nullopt when a known key has a value that is not a number in range.
std::optional<stream_probe_params> parse_stream_probe_query(std::string_view query);

// Writes event number i into `out` (reusing its capacity):
// data: {"i":<i>,"t_us":<t_us>,"pad":"xx.."}\n\n, the pad making it `bytes` long when it can.
void render_stream_probe_event(std::string& out, std::uint64_t i, std::int64_t t_us, std::size_t bytes);

}  // namespace dplb::mock
