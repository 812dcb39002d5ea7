#pragma once
// Private to the session: the X-Request-Id dplb sends the engines. vLLM names a request by it (its request id,
// in its logs and in the kv_transfer_params by which a decode instance finds the prefill's blocks), so it must
// be unique per request: a client's id goes to the engines with a suffix of dplb's, random and unguessable
// (clients reuse ids, and a hostile one could reuse another's on purpose to pair its request with theirs),
// and the client's own stays in the access log and in the response head it gets. The suffix, rather than an id
// of dplb's own in place of the client's, keeps the engines' logs searchable by the client's id. A request
// without one gets none, unless it runs in two legs: both legs must carry one, the same, so dplb makes it.

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

// What the engines get for a client's `client_id`: it, a dash, and 16 hex digits from the system's random
// source (not a seeded generator, whose next outputs a client could work out from ids an engine echoes).
inline std::string engine_request_id(std::string_view client_id) {
  thread_local std::random_device source;
  static constexpr char digits[] = "0123456789abcdef";
  std::string out;
  out.reserve(client_id.size() + 17);
  out += client_id;
  out += '-';
  for (int word = 0; word < 2; ++word) {
    const std::uint32_t bits = source();
    for (int i = 7; i >= 0; --i) out += digits[(bits >> (4 * i)) & 0xf];
  }
  return out;
}

// The request's ids, written into the engine's request head (`head`, its fields from `fields_from`): the
// client's (empty: none, or one dplb strips), and what the engines get (empty: none is sent).
struct request_ids {
  std::string client;
  std::string engine;
};
inline void assign_request_ids(const http::field_list& client_fields, bool two_legs, std::string& head,
                               std::size_t fields_from, request_ids& out) {
  out.client.clear();
  out.engine.clear();
  if (auto given = forwarded_request_id(client_fields)) {
    out.client = std::move(*given);
    out.engine = engine_request_id(out.client);
  } else if (two_legs) {
    out.engine = new_request_id();
  } else {
    return;
  }
  replace_request_id(head, fields_from, out.engine);
}

}  // namespace dplb::server
