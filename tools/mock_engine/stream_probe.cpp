#include "stream_probe.hpp"

#include <charconv>

namespace dplb::mock {
namespace {

// Bounds that keep a typo from tying up the engine: a million events, a minute apart at most, 16 MiB each.
constexpr std::uint64_t max_events = 1'000'000;
constexpr std::uint64_t max_interval_ms = 60'000;
constexpr std::uint64_t max_bytes = 16u << 20;

std::optional<std::uint64_t> number(std::string_view text, std::uint64_t max) {
  std::uint64_t value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || value > max) return std::nullopt;
  return value;
}

void append_number(std::string& out, std::int64_t value) {
  char digits[24];
  const auto [end, ec] = std::to_chars(digits, digits + sizeof digits, value);
  out.append(digits, end);
}

}  // namespace

std::optional<stream_probe_params> parse_stream_probe_query(std::string_view query) {
  stream_probe_params params;
  while (!query.empty()) {
    const auto amp = query.find('&');
    const auto pair = query.substr(0, amp);
    query = amp == std::string_view::npos ? std::string_view{} : query.substr(amp + 1);
    const auto eq = pair.find('=');
    if (eq == std::string_view::npos) continue;
    const auto key = pair.substr(0, eq);
    const auto value = pair.substr(eq + 1);
    if (key == "events") {
      const auto n = number(value, max_events);
      if (!n) return std::nullopt;
      params.events = *n;
    } else if (key == "interval_ms") {
      const auto n = number(value, max_interval_ms);
      if (!n) return std::nullopt;
      params.interval = std::chrono::milliseconds(*n);
    } else if (key == "bytes") {
      const auto n = number(value, max_bytes);
      if (!n) return std::nullopt;
      params.bytes = static_cast<std::size_t>(*n);
    }
  }
  return params;
}

void render_stream_probe_event(std::string& out, std::uint64_t i, std::int64_t t_us, std::size_t bytes) {
  constexpr std::string_view tail = "\"}\n\n";
  out.assign("data: {\"i\":");
  append_number(out, static_cast<std::int64_t>(i));
  out.append(",\"t_us\":");
  append_number(out, t_us);
  out.append(",\"pad\":\"");
  const auto unpadded = out.size() + tail.size();
  if (bytes > unpadded) out.append(bytes - unpadded, 'x');
  out.append(tail);
}

}  // namespace dplb::mock
