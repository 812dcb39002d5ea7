#pragma once
// Private to the session: a disaggregated request's X-Request-Id. Both legs carry the same one: the engines
// name the request by it (vLLM's request id, in its logs and in the kv_transfer_params the decode instance
// reads), so the prefill and decode of one request can be told apart from those of any other. The client's
// is kept; dplb makes one for a request that has none (or an empty or hop-by-hop one).

#include <cstddef>
#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <string_view>

#include <boost/beast/core/string.hpp>

#include "dplb/http/header_sanitizer.hpp"
#include "dplb/http/message_head.hpp"

namespace dplb::server {

// The client's X-Request-Id as the engines would get it: its first (vLLM reads the first), unless that is empty
// or hop-by-hop (named in Connection: dplb strips it). Then dplb makes one (replace_request_id).
inline std::optional<std::string> forwarded_request_id(const http::field_list& fields) {
  const http::connection_options options(fields);
  for (const auto& field : fields) {
    if (!boost::beast::iequals(field.name_string, "x-request-id")) continue;
    if (field.value.empty() || !http::crosses(field, options)) return std::nullopt;
    return std::string(field.value);
  }
  return std::nullopt;
}

// Sets the engine's request head's X-Request-Id to `id`: any the client sent is removed (an empty one would
// come first and be the one vLLM reads), and `id` appended. `fields_from`: where the fields start in `head`.
inline void replace_request_id(std::string& head, std::size_t fields_from, std::string_view id) {
  static constexpr std::string_view name = "x-request-id:";
  for (std::size_t line = fields_from; line < head.size();) {
    const auto end = head.find("\r\n", line);
    if (end == std::string::npos) break;
    if (end - line >= name.size() && boost::beast::iequals(std::string_view(head).substr(line, name.size()), name)) {
      head.erase(line, end + 2 - line);
    } else {
      line = end + 2;
    }
  }
  head += "X-Request-Id: ";
  head += id;
  head += "\r\n";
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
