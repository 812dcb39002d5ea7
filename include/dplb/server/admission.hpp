#pragma once
// Admission: what dplb does with a client's request once its head is parsed, decided without any I/O so
// that the session, the unit tests and the request-head fuzzer all run the same code. A request is either
// refused (a status and a message; the connection closes after the answer, since what follows the head
// cannot be trusted), answered from one of dplb's own paths, or proxied. The engine's request head is
// then written from the client's by prepare_upstream_request(), straight into bytes.

#include <boost/asio/buffer.hpp>
#include <boost/beast/http/verb.hpp>

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "dplb/http/message_head.hpp"

namespace dplb::server {

enum class request_route { proxy, metrics, health };

struct admission {
  unsigned refusal_status = 0;  // non-zero: answer this status with `refusal_message`, then close
  std::string_view refusal_message;
  request_route route = request_route::proxy;
  bool send_continue = false;  // answer "100 Continue" before reading the body (Expect on HTTP/1.1)
  // The target the engine gets: the client's, or the path of an absolute-form one: a view into the head,
  // or, in the rare case the path must be completed with a '/', a string of its own.
  std::string_view target_in_head;
  std::string owned_target;
  // The rank the client named in X-data-parallel-rank (dplb's global numbering), when it sent an integer:
  // checked against the rank count by the session. Not an integer: ignored, as vLLM ignores it.
  std::optional<std::int64_t> pinned_rank;
  // Several X-data-parallel-rank values that disagree: the session answers 400 once the body is read
  // (the framing is sound, so the connection stays open).
  bool pinned_rank_conflict = false;

  bool refused() const noexcept { return refusal_status != 0; }
  std::string_view target() const noexcept { return owned_target.empty() ? target_in_head : owned_target; }
};

// Decides on a request from its head alone (the body is not read yet): framing that could be read two
// ways (400, 501), Transfer-Encoding in HTTP/1.0 (400), CONNECT and TRACE (405), a target that is
// neither a path nor an absolute http URL (400), a missing (HTTP/1.1) or repeated Host (400), a
// Connection header listing more than http::connection_options::max_options options (400). An
// absolute-form target leaves as its path: only configured backends are ever reached.
admission admit(const http::request_head& head);

// GET or HEAD /v1/models (any query): answered by dplb itself when clusters list their models.
inline bool is_models_list(boost::beast::http::verb method, std::string_view target) {
  namespace bhttp = boost::beast::http;
  return (method == bhttp::verb::get || method == bhttp::verb::head) && target.substr(0, target.find('?')) == "/v1/models";
}

// POST /v1/completions or /v1/chat/completions (any query): what a disaggregated cluster runs in two legs, as
// vLLM's disaggregated proxy does.
inline bool is_completion(boost::beast::http::verb method, std::string_view target) {
  const auto path = target.substr(0, target.find('?'));
  return method == boost::beast::http::verb::post && (path == "/v1/completions" || path == "/v1/chat/completions");
}

// The engine's request head, written once per request and sent with each attempt as
//   request line | the rank's Host line | fields | framing
// since the rank (so the Host) is known only once the body is read, and the length only then too.
struct upstream_head {
  std::string bytes;                 // the request line, then the fields
  std::size_t request_line_end = 0;  // where the Host line goes
  std::string framing;               // "Content-Length: n\r\n" (when there is one) and the empty line

  // The pieces of one gathered write: head, Host line, fields, framing, body.
  std::array<boost::asio::const_buffer, 5> pieces(std::string_view host_line, std::string_view body) const {
    return {boost::asio::buffer(bytes.data(), request_line_end), boost::asio::buffer(host_line),
            boost::asio::buffer(bytes.data() + request_line_end, bytes.size() - request_line_end),
            boost::asio::buffer(framing), boost::asio::buffer(body)};
  }
};

// Writes the engine's request head from an admitted client's: HTTP/1.1, the admitted target, every field
// but the hop-by-hop ones, Host, Expect (dplb answered it) and the framing; X-Forwarded-For and Via with
// every line the client sent joined and dplb's hop appended, X-Forwarded-Proto set. Returns false, for a
// 431, when a forwarding header would grow past http::max_forwarding_header_bytes.
bool prepare_upstream_request(const http::request_head& head, std::string_view target,
                              std::string_view client_address, upstream_head& out);

// The framing of the engine's request once the body is read whole (a chunked request goes on with a
// Content-Length): none for an empty body of a method that carries none, as Beast's prepare_payload does.
void set_upstream_framing(upstream_head& out, boost::beast::http::verb method, std::size_t body_size);

}  // namespace dplb::server
