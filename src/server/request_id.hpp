#pragma once
// Private to the session: a disaggregated request's X-Request-Id. Both legs carry the same one: the engines
// name the request by it (vLLM's request id, in its logs and in the kv_transfer_params the decode instance
// reads), so the prefill and decode of one request can be told apart from those of any other. The client's
// is kept; dplb makes one for a request that has none.

#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <string_view>

#include "dplb/http/message_head.hpp"

namespace dplb::server {

// The first X-Request-Id the client sent (vLLM reads the first), when it sent one.
inline std::optional<std::string> first_request_id(const http::field_list& fields) {
  if (fields.count(std::string_view("x-request-id")) == 0) return std::nullopt;
  return std::string(fields.value(std::string_view("x-request-id")));
}

// A random version-4 UUID (as vLLM's own disaggregated proxy makes its ids), from a per-thread generator.
inline std::string new_request_id() {
  thread_local std::mt19937_64 generator{std::random_device{}()};
  const std::uint64_t high = (generator() & 0xffffffffffff0fffULL) | 0x0000000000004000ULL;
  const std::uint64_t low = (generator() & 0x3fffffffffffffffULL) | 0x8000000000000000ULL;
  static constexpr char digits[] = "0123456789abcdef";
  std::string out;
  out.reserve(36);
  const auto append = [&](std::uint64_t value, int from_nibble, int count) {
    for (int i = from_nibble; i < from_nibble + count; ++i) out += digits[(value >> (60 - 4 * i)) & 0xf];
  };
  append(high, 0, 8);
  out += '-';
  append(high, 8, 4);
  out += '-';
  append(high, 12, 4);
  out += '-';
  append(low, 0, 4);
  out += '-';
  append(low, 4, 12);
  return out;
}

}  // namespace dplb::server
