#include "dplb/server/admission.hpp"

#include <boost/beast/core/string.hpp>
#include <boost/url/parse.hpp>

#include <cstdint>
#include <limits>

#include "dplb/http/header_sanitizer.hpp"
#include "dplb/http/wire_format.hpp"

namespace dplb::server {

namespace bhttp = boost::beast::http;

namespace {

std::string_view path_of(std::string_view target) { return target.substr(0, target.find('?')); }

// An absolute-form target (GET http://host/path) leaves as its path: the authority in it is never where
// the request goes, and dplb's own paths are recognised in it. Returns false for a target that is neither.
bool to_origin_form(const http::request_head& head, admission& decision) {
  const auto target = head.target;
  decision.target_in_head = target;
  if (!target.empty() && target.front() == '/') return true;
  if (target == "*") return head.method == bhttp::verb::options;
  auto url = boost::urls::parse_absolute_uri(target);
  if (!url || (url->scheme_id() != boost::urls::scheme::http && url->scheme_id() != boost::urls::scheme::https)) {
    return false;
  }
  // An http URL has an authority and an absolute path (RFC 9110 4.2.1). Without this check "http:x" or
  // "http://h:.1/x" (read by Boost.URL 1.81 as the path ".1/x") would become a target without its '/'.
  const std::string_view path = url->encoded_path();
  if (!url->has_authority() || (!path.empty() && path.front() != '/')) return false;
  if (!path.empty()) {
    // The path and the query that follows it are the end of the target: a view of it is the origin form
    // (an absolute-URI has no fragment).
    decision.target_in_head = target.substr(static_cast<std::size_t>(path.data() - target.data()));
    return true;
  }
  // "http://host?q": the path is empty, and its origin form "/?q" is not in the target.
  decision.owned_target.push_back('/');
  if (url->has_query()) {
    const std::string_view query = url->encoded_query();
    decision.owned_target.push_back('?');
    decision.owned_target.append(query.data(), query.size());
  }
  return true;
}

bool is_dp_rank_header(const http::field_view& field) noexcept {
  return field.name == bhttp::field::unknown && boost::beast::iequals(field.name_string, "x-data-parallel-rank");
}

// The client's X-data-parallel-rank, read as vLLM reads it: an integer (a sign allowed; one beyond the
// 64-bit range is kept as out of range), anything else ignored. Several lines must agree.
bool read_pinned_rank(const http::field_list& fields, admission& decision) {
  for (const auto& field : fields) {
    if (!is_dp_rank_header(field)) continue;
    std::string_view text = field.value;
    const bool negative = text.starts_with('-');
    if (negative || text.starts_with('+')) text.remove_prefix(1);
    if (text.empty() || text.find_first_not_of("0123456789") != std::string_view::npos) continue;
    std::int64_t value = 0;
    for (const char c : text) {
      value = value > (std::numeric_limits<std::int64_t>::max() - 9) / 10 ? std::numeric_limits<std::int64_t>::max()
                                                                            : value * 10 + (c - '0');
    }
    if (negative) value = -value;
    if (decision.pinned_rank && *decision.pinned_rank != value) return false;
    decision.pinned_rank = value;
  }
  return true;
}

admission refuse(unsigned status, std::string_view message) {
  admission decision;
  decision.refusal_status = status;
  decision.refusal_message = message;
  return decision;
}

}  // namespace

admission admit(const http::request_head& head) {
  if (auto problem = http::check_request_framing(head.fields)) {
    // The body's end cannot be known: answer and close, never guess.
    return refuse(problem->status, problem->message);
  }
  if (head.version < 11 && head.fields.count(bhttp::field::transfer_encoding) > 0) {
    return refuse(400, "Transfer-Encoding is not allowed in an HTTP/1.0 request");
  }
  if (head.method == bhttp::verb::connect || head.method == bhttp::verb::trace) {
    // dplb is no forward proxy (CONNECT), and TRACE only reflects headers back (cross-site tracing).
    return refuse(405, "method not allowed through dplb");
  }
  admission decision;
  if (!to_origin_form(head, decision)) {
    return refuse(400, "request target must be a path (origin-form) or an absolute http URL");
  }
  // RFC 9112 3.2: a server answers 400 to an HTTP/1.1 request without Host, and to any with two.
  std::size_t hosts = 0;
  std::string_view expect;
  for (const auto& field : head.fields) {
    if (field.name == bhttp::field::host) ++hosts;
    if (field.name == bhttp::field::expect && expect.empty()) expect = field.value;
  }
  if (hosts > 1) return refuse(400, "request has more than one Host header");
  if (hosts == 0 && head.version >= 11) return refuse(400, "HTTP/1.1 request has no Host header");
  if (http::connection_options(head.fields).too_many()) {
    return refuse(400, "request's Connection header lists too many options");
  }

  decision.pinned_rank_conflict = !read_pinned_rank(head.fields, decision);

  const auto path = path_of(decision.target());
  decision.route = path == "/metrics" ? request_route::metrics
                   : path == "/health" ? request_route::health
                                       : request_route::proxy;
  // dplb reads the whole body before it picks a rank (so that a request can be re-sent), so it answers
  // the client's Expect itself; without this, curl and others stall a second before sending. An
  // HTTP/1.0 client knows no interim response (RFC 9110 10.1.1) and sends its body regardless.
  decision.send_continue = head.version >= 11 && boost::beast::iequals(expect, "100-continue");
  return decision;
}

namespace {

// X-Forwarded-For and X-Forwarded-Proto are no names Beast knows: they are told apart by their text.
bool is_x_forwarded_for(const http::field_view& field) noexcept {
  return field.name == bhttp::field::unknown && boost::beast::iequals(field.name_string, "x-forwarded-for");
}
bool is_via(const http::field_view& field) noexcept { return field.name == bhttp::field::via; }

// Whether the field is one dplb writes itself into the engine's request.
bool rewritten_upstream(const http::field_view& field) noexcept {
  switch (field.name) {
    case bhttp::field::host:
    case bhttp::field::expect:
    case bhttp::field::content_length:
    case bhttp::field::via:
      return true;
    case bhttp::field::unknown:
      // The client's X-data-parallel-rank picked a global rank in dplb; the engine gets its own index
      // (a rank of a `#dp=N` backend) or none at all (a plain backend refuses any value but its own).
      return boost::beast::iequals(field.name_string, "x-forwarded-for") ||
             boost::beast::iequals(field.name_string, "x-forwarded-proto") || is_dp_rank_header(field);
    default:
      return false;
  }
}

// Appends `name: <every line the client sent, joined>, <item>`, so that no hop recorded by an earlier
// proxy is lost. Returns false when the value would exceed the bound.
template <class IsField>
bool append_list_field(std::string& out, const http::field_list& fields, IsField is_field,
                       std::string_view name_string, std::string_view item) {
  const auto start = out.size();
  out += name_string;
  out += ": ";
  const auto value_start = out.size();
  for (const auto& field : fields) {
    if (!is_field(field)) continue;
    http::for_each_list_item(field.value, [&](std::string_view piece) {
      out += piece;
      out += ", ";
    });
    if (out.size() - value_start > http::max_forwarding_header_bytes) break;
  }
  out += item;
  if (out.size() - value_start > http::max_forwarding_header_bytes) {
    out.resize(start);
    return false;
  }
  out += "\r\n";
  return true;
}

}  // namespace

bool prepare_upstream_request(const http::request_head& head, std::string_view target,
                              std::string_view client_address, upstream_head& out) {
  out.bytes.clear();
  out.bytes += head.method_string;
  out.bytes += ' ';
  out.bytes += target;
  out.bytes += " HTTP/1.1\r\n";
  out.request_line_end = out.bytes.size();
  const http::connection_options options(head.fields);
  for (const auto& field : head.fields) {
    if (http::crosses(field, options) && !rewritten_upstream(field)) http::append_field(out.bytes, field.name_string, field.value);
  }
  if (!append_list_field(out.bytes, head.fields, is_x_forwarded_for, "X-Forwarded-For", client_address) ||
      !append_list_field(out.bytes, head.fields, is_via, "Via", "1.1 dplb")) {
    return false;
  }
  out.bytes += "X-Forwarded-Proto: http\r\n";
  return true;
}

void set_upstream_framing(upstream_head& out, bhttp::verb method, std::size_t body_size) {
  out.framing.clear();
  const bool carries_body = method == bhttp::verb::post || method == bhttp::verb::put ||
                            method == bhttp::verb::patch || method == bhttp::verb::options;
  if (body_size > 0 || carries_body) {
    out.framing += "Content-Length: ";
    http::append_decimal(out.framing, body_size);
    out.framing += "\r\n";
  }
  out.framing += "\r\n";
}

}  // namespace dplb::server
