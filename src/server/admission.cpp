#include "dplb/server/admission.hpp"

#include <boost/beast/core/string.hpp>
#include <boost/url/parse.hpp>
#include <string>

#include "dplb/http/header_sanitizer.hpp"

namespace dplb::server {

namespace bhttp = boost::beast::http;

void request_parser::on_field_impl(bhttp::field name, boost::beast::string_view name_string,
                                   boost::beast::string_view value, boost::beast::error_code& ec) {
  ec = {};
  if (is_header_done()) return;  // a trailer field, after the last chunk
  get().insert(name, name_string, value);
}

namespace {

std::string_view path_of(std::string_view target) { return target.substr(0, target.find('?')); }

// An absolute-form target (GET http://host/path) becomes its path: the authority in it is never where the
// request goes, and dplb's own paths are recognised in it.
bool to_origin_form(client_request::header_type& head) {
  const auto target = head.target();
  if (!target.empty() && target.front() == '/') return true;
  if (target == "*") return head.method() == bhttp::verb::options;
  auto url = boost::urls::parse_absolute_uri(target);
  if (!url || (url->scheme_id() != boost::urls::scheme::http && url->scheme_id() != boost::urls::scheme::https)) {
    return false;
  }
  // An http URL has an authority and an absolute path (RFC 9110 4.2.1). Without this check "http:x" or
  // "http://h:.1/x" (read by Boost.URL 1.81 as the path ".1/x") would become a target without its '/'.
  const std::string_view path = url->encoded_path();
  if (!url->has_authority() || (!path.empty() && path.front() != '/')) return false;
  std::string origin(path.empty() ? "/" : path);
  if (url->has_query()) {
    origin += '?';
    origin += url->encoded_query();
  }
  head.target(origin);
  return true;
}

admission refuse(unsigned status, std::string_view message) { return admission{status, message}; }

}  // namespace

admission admit(client_request::header_type& head) {
  if (auto problem = http::check_request_framing(head)) {
    // The body's end cannot be known: answer and close, never guess.
    return refuse(problem->status, problem->message);
  }
  if (head.version() < 11 && head.count(bhttp::field::transfer_encoding) > 0) {
    return refuse(400, "Transfer-Encoding is not allowed in an HTTP/1.0 request");
  }
  if (head.method() == bhttp::verb::connect || head.method() == bhttp::verb::trace) {
    // dplb is no forward proxy (CONNECT), and TRACE only reflects headers back (cross-site tracing).
    return refuse(405, "method not allowed through dplb");
  }
  if (!to_origin_form(head)) {
    return refuse(400, "request target must be a path (origin-form) or an absolute http URL");
  }
  // RFC 9112 3.2: a server answers 400 to an HTTP/1.1 request without Host, and to any with two.
  const auto hosts = head.count(bhttp::field::host);
  if (hosts > 1) return refuse(400, "request has more than one Host header");
  if (hosts == 0 && head.version() >= 11) return refuse(400, "HTTP/1.1 request has no Host header");

  admission decision;
  const auto path = path_of(head.target());
  decision.route = path == "/metrics" ? request_route::metrics
                   : path == "/health" ? request_route::health
                                       : request_route::proxy;
  // dplb reads the whole body before it picks a rank (so that a request can be re-sent), so it answers
  // the client's Expect itself; without this, curl and others stall a second before sending. An
  // HTTP/1.0 client knows no interim response (RFC 9110 10.1.1) and sends its body regardless.
  decision.send_continue =
      head.version() >= 11 && boost::beast::iequals(head[bhttp::field::expect], "100-continue");
  return decision;
}

bool prepare_upstream_request(client_request& request, std::string_view client_address) {
  http::strip_hop_by_hop(request);
  request.erase(bhttp::field::expect);
  if (!http::add_forwarding_headers(request, client_address)) return false;
  request.version(11);
  request.keep_alive(true);
  request.prepare_payload();  // the body was read whole: a chunked request goes on with a Content-Length
  return true;
}

}  // namespace dplb::server
