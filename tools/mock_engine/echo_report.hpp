#pragma once
// The /mock/echo answer: what the engine received, so tests can check what a proxy forwarded.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace dplb::mock {

// FNV-1a, 64 bit: a body fingerprint any test can recompute in a few lines.
constexpr std::uint64_t fnv1a64(std::string_view bytes) noexcept {
  std::uint64_t hash = 0xcbf29ce484222325ULL;
  for (const char c : bytes) {
    hash ^= static_cast<unsigned char>(c);
    hash *= 0x100000001b3ULL;
  }
  return hash;
}

struct received_request {
  std::string_view method;
  std::string_view target;
  std::vector<std::pair<std::string_view, std::string_view>> headers;  // received order and spelling
  std::string_view body;
  bool chunked = false;  // the body came with Transfer-Encoding: chunked
  unsigned engine = 0;   // the DP engine of the port that answered (its index on the port)
  std::optional<std::string_view> dp_rank_header;  // X-data-parallel-rank as received, if any
};

// {"method":..,"target":..,"headers":[[name,value],..],"body_size":N,"body_fnv1a64":"<16 hex>","chunked":b,
//  "engine":j,"x_data_parallel_rank":"<value>"|null}
std::string render_echo_report(const received_request& request);

}  // namespace dplb::mock
