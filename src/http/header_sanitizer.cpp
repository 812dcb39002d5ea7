#include "dplb/http/header_sanitizer.hpp"

#include <algorithm>
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

void strip_hop_by_hop(bhttp::fields& fields) {
  // Names listed in Connection are hop-by-hop too; collect them first, the erase invalidates views.
  std::vector<std::string> named;
  for (auto it = fields.find(bhttp::field::connection); it != fields.end() && it->name() == bhttp::field::connection; ++it) {
    for_each_list_item(it->value(), [&](std::string_view item) { named.emplace_back(item); });
  }
  for (const auto& name : named) fields.erase(name);
  for (auto f : {bhttp::field::connection, bhttp::field::keep_alive, bhttp::field::proxy_connection,
                 bhttp::field::te, bhttp::field::transfer_encoding, bhttp::field::upgrade,
                 bhttp::field::proxy_authorization, bhttp::field::proxy_authenticate}) {
    fields.erase(f);
  }
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

void add_forwarding_headers(bhttp::fields& fields, std::string_view client_address) {
  auto existing = fields.find("x-forwarded-for");
  if (existing != fields.end()) {
    std::string combined(existing->value());
    combined += ", ";
    combined += client_address;
    fields.set("x-forwarded-for", combined);
  } else {
    fields.set("x-forwarded-for", client_address);
  }
  fields.set("x-forwarded-proto", "http");
  auto via = fields.find(bhttp::field::via);
  if (via != fields.end()) {
    std::string combined(via->value());
    combined += ", 1.1 dplb";
    fields.set(bhttp::field::via, combined);
  } else {
    fields.set(bhttp::field::via, "1.1 dplb");
  }
}

}  // namespace dplb::http
