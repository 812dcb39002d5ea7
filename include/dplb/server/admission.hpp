#pragma once
// Admission: what dplb does with a client's request once its head is parsed, decided without any I/O so
// that the session, the unit tests and the request-head fuzzer all run the same code. A request is either
// refused (a status and a message; the connection closes after the answer, since what follows the head
// cannot be trusted), answered from one of dplb's own paths, or proxied. The request for the engine is
// then built from the client's by prepare_upstream_request().

#include <boost/beast/http/message.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/string_body.hpp>
#include <string_view>

namespace dplb::server {

using client_request = boost::beast::http::request<boost::beast::http::string_body>;

// Beast's request parser, except that a chunked body's trailer fields are dropped instead of joining the
// head: the body leaves for the engine with a Content-Length, so trailers have nowhere to go, and a field
// that arrives after the body must never pass for a header the client sent with the head.
class request_parser : public boost::beast::http::request_parser<boost::beast::http::string_body> {
 public:
  request_parser() = default;

 private:
  void on_field_impl(boost::beast::http::field name, boost::beast::string_view name_string,
                     boost::beast::string_view value, boost::beast::error_code& ec) override;
};

enum class request_route { proxy, metrics, health };

struct admission {
  unsigned refusal_status = 0;  // non-zero: answer this status with `refusal_message`, then close
  std::string_view refusal_message;
  request_route route = request_route::proxy;
  bool send_continue = false;  // answer "100 Continue" before reading the body (Expect on HTTP/1.1)

  bool refused() const noexcept { return refusal_status != 0; }
};

// Decides on a request from its head alone (the body is not read yet): framing that could be read two
// ways (400, 501), Transfer-Encoding in HTTP/1.0 (400), CONNECT and TRACE (405), a target that is
// neither a path nor an absolute http URL (400), a missing (HTTP/1.1) or repeated Host (400). An
// absolute-form target is rewritten in place to its path: only configured backends are ever reached.
admission admit(client_request::header_type& head);

// Builds the engine's request in place from the client's, whose body has been read whole: hop-by-hop
// headers stripped, Expect dropped (dplb answered it), X-Forwarded-For, Via and X-Forwarded-Proto
// appended, HTTP/1.1 with keep-alive, framed by Content-Length. The Host is the rank's, set when the rank
// is known. Returns false, for a 431, when a forwarding header would grow past its bound.
bool prepare_upstream_request(client_request& request, std::string_view client_address);

}  // namespace dplb::server
