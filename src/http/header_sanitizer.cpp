#include "dplb/http/header_sanitizer.hpp"

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

namespace dplb::http {

namespace bhttp = boost::beast::http;

namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

bool iequals(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return (x | 0x20) == (y | 0x20);
         });
}

template <class Fn>
void for_each_list_item(std::string_view list, Fn&& fn) {
  while (!list.empty()) {
    const auto comma = list.find(',');
    const auto item = trim(list.substr(0, comma));
    if (!item.empty()) fn(item);
    if (comma == std::string_view::npos) break;
    list.remove_prefix(comma + 1);
  }
}

}  // namespace

namespace {

bool always_hop_by_hop(bhttp::field name) {
  switch (name) {
    case bhttp::field::connection:
    case bhttp::field::keep_alive:
    case bhttp::field::proxy_connection:
    case bhttp::field::te:
    case bhttp::field::transfer_encoding:
    case bhttp::field::upgrade:
    case bhttp::field::proxy_authorization:
    case bhttp::field::proxy_authenticate:
      return true;
    default:
      return false;
  }
}

}  // namespace

void strip_hop_by_hop(bhttp::fields& fields) {
  // The names listed in Connection are hop-by-hop too (Connection itself is seldom sent by clients that
  // keep alive, so the common case reads nothing here). One pass over the fields then erases every
  // hop-by-hop one by iterator, instead of a lookup by name per hop-by-hop header.
  std::string_view connection_values[8];
  std::size_t connection_lines = 0;
  bool more_connection_lines = false;
  for (auto it = fields.find(bhttp::field::connection); it != fields.end() && it->name() == bhttp::field::connection;
       ++it) {
    if (connection_lines == std::size(connection_values)) {
      more_connection_lines = true;
      break;
    }
    connection_values[connection_lines++] = it->value();
  }
  std::vector<std::string> many_named;  // only for a head with more Connection lines than fit above
  if (more_connection_lines) {
    for (auto it = fields.find(bhttp::field::connection); it != fields.end() && it->name() == bhttp::field::connection;
         ++it) {
      for_each_list_item(it->value(), [&](std::string_view item) { many_named.emplace_back(item); });
    }
  }
  const auto named_in_connection = [&](std::string_view name) {
    // A message's length is never the sender's to name away: dropping Content-Length here would leave
    // the other side without framing (Transfer-Encoding is always removed, and re-applied by the caller).
    if (iequals(name, "content-length")) return false;
    if (more_connection_lines) {
      return std::any_of(many_named.begin(), many_named.end(), [&](const std::string& n) { return iequals(n, name); });
    }
    bool found = false;
    for (std::size_t i = 0; i < connection_lines && !found; ++i) {
      for_each_list_item(connection_values[i], [&](std::string_view item) { found = found || iequals(item, name); });
    }
    return found;
  };
  for (auto it = fields.begin(); it != fields.end();) {
    // The erases below happen after every Connection value was read: a value erased early would dangle.
    const bool hop = always_hop_by_hop(it->name()) || (connection_lines > 0 && named_in_connection(it->name_string()));
    if (hop && it->name() != bhttp::field::connection) {
      it = fields.erase(it);
    } else {
      ++it;
    }
  }
  fields.erase(bhttp::field::connection);
}

head_scan find_head_end(std::string_view bytes, std::size_t from) noexcept {
  // Leading empty lines before a request line are allowed (RFC 9112 2.2) and are not the end.
  std::size_t start = 0;
  while (start < bytes.size() && (bytes[start] == '\r' || bytes[start] == '\n')) ++start;
  std::size_t i = std::max(from, start);
  while (i < bytes.size()) {
    const void* nl = std::memchr(bytes.data() + i, '\n', bytes.size() - i);
    if (!nl) return {false, false, 0, bytes.size()};
    const std::size_t at = static_cast<std::size_t>(static_cast<const char*>(nl) - bytes.data());
    const std::size_t next = at + 1;
    if (next >= bytes.size()) return {false, false, 0, at};  // the next line's first byte is not here yet
    if (bytes[next] == '\n' || (bytes[next] == '\r' && next + 1 < bytes.size() && bytes[next + 1] == '\n')) {
      const std::size_t length = next + (bytes[next] == '\n' ? 1 : 2);
      // Any line of the head (after the request line) that starts with SP or HTAB is a fold.
      bool folded = false;
      for (std::size_t k = start; k + 1 < length && !folded; ++k) {
        folded = bytes[k] == '\n' && (bytes[k + 1] == ' ' || bytes[k + 1] == '\t');
      }
      return {true, folded, length, 0};
    }
    if (bytes[next] == '\r' && next + 1 >= bytes.size()) return {false, false, 0, at};
    i = next;
  }
  return {false, false, 0, bytes.size() > 0 ? bytes.size() - 1 : 0};
}

std::optional<framing_problem> check_request_framing(const bhttp::fields& fields) {
  const auto content_lengths = fields.count(bhttp::field::content_length);
  const auto transfer_encodings = fields.count(bhttp::field::transfer_encoding);
  if (content_lengths > 0 && transfer_encodings > 0) {
    return framing_problem{400, "request has both Content-Length and Transfer-Encoding"};
  }
  if (content_lengths > 1) return framing_problem{400, "request has more than one Content-Length"};
  if (content_lengths == 1) {
    const auto value = fields[bhttp::field::content_length];
    if (value.empty() || value.size() > 19 ||
        !std::all_of(value.begin(), value.end(), [](char c) { return c >= '0' && c <= '9'; })) {
      return framing_problem{400, "request has an invalid Content-Length"};
    }
  }
  if (transfer_encodings > 1) return framing_problem{400, "request has more than one Transfer-Encoding"};
  if (transfer_encodings == 1) {
    std::size_t codings = 0;
    bool only_chunked = true;
    for_each_list_item(fields[bhttp::field::transfer_encoding], [&](std::string_view item) {
      ++codings;
      only_chunked = only_chunked && iequals(item, "chunked");
    });
    if (codings != 1 || !only_chunked) {
      return framing_problem{501, "request uses a transfer coding other than chunked"};
    }
  }
  return std::nullopt;
}

namespace {

// Joins every line of a list header (a client may send several) and appends one item, so that no hop
// recorded by an earlier proxy is lost.
bool append_list_item(bhttp::fields& fields, std::string_view name, std::string_view item) {
  if (fields.find(name) == fields.end()) {  // the usual case: dplb is the first hop
    if (item.size() > max_forwarding_header_bytes) return false;
    fields.insert(name, item);
    return true;
  }
  std::string combined;
  for (auto it = fields.find(name); it != fields.end() && iequals(it->name_string(), name); ++it) {
    const auto value = trim(it->value());
    if (value.empty()) continue;
    if (!combined.empty()) combined += ", ";
    combined += value;
  }
  if (!combined.empty()) combined += ", ";
  combined += item;
  if (combined.size() > max_forwarding_header_bytes) return false;
  fields.erase(name);
  fields.set(name, combined);
  return true;
}

}  // namespace

bool add_forwarding_headers(bhttp::fields& fields, std::string_view client_address) {
  if (!append_list_item(fields, "x-forwarded-for", client_address)) return false;
  if (!append_list_item(fields, "via", "1.1 dplb")) return false;
  fields.set("x-forwarded-proto", "http");
  return true;
}

}  // namespace dplb::http
