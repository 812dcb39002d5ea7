#pragma once
// Header rules of an HTTP/1.1 intermediary (RFC 9110 7.6.1, RFC 9112 6): what must not cross dplb, and
// which request framings are ambiguous enough to be refused. Pure functions over Beast's field maps.

#include <boost/beast/http/fields.hpp>
#include <optional>
#include <string_view>

namespace dplb::http {

// Removes the hop-by-hop headers: Connection and every header it names, Keep-Alive, Proxy-Connection,
// TE, Transfer-Encoding, Upgrade, Proxy-Authorization and Proxy-Authenticate (meant for a proxy, never
// for the engine). Framing (Content-Length / chunked) is re-applied by the caller; a Content-Length that
// Connection names is kept, since framing comes from the parser's view of the message.
void strip_hop_by_hop(boost::beast::http::fields& fields);

// Why a request's framing is refused, or nullopt when it is unambiguous.
struct framing_problem {
  unsigned status;           // 400, or 501 for a transfer coding dplb does not implement
  std::string_view message;  // for the client, in the error JSON
};

// Refuses what request smuggling relies on: Content-Length together with Transfer-Encoding,
// Content-Length repeated or not a plain decimal number, any transfer coding other than a single
// "chunked".
std::optional<framing_problem> check_request_framing(const boost::beast::http::fields& fields);

// Where a request head ends in raw bytes, and whether it folds a header line (obs-fold: a line that
// starts with a space or tab continues the previous one). Scanning resumes at `from` (the previous
// result's `searched`) so that a head arriving in many small reads is not rescanned from the start.
struct head_scan {
  bool complete = false;      // an empty line ("\r\n\r\n", or "\n\n") ends the head
  bool folded = false;        // meaningful when complete
  std::size_t length = 0;     // bytes of the head including the empty line, when complete
  std::size_t searched = 0;   // resume point for the next scan, when not complete
};
head_scan find_head_end(std::string_view bytes, std::size_t from = 0) noexcept;

// Longest X-Forwarded-For or Via value dplb will send (Beast refuses field values near 64 KiB).
inline constexpr std::size_t max_forwarding_header_bytes = 16 * 1024;

// Appends the client address to X-Forwarded-For and "1.1 dplb" to Via, joining every line of each that
// the client sent (so no earlier hop is lost), and sets X-Forwarded-Proto. Returns false, changing
// nothing that matters, when a joined value would exceed max_forwarding_header_bytes (answer 431).
bool add_forwarding_headers(boost::beast::http::fields& fields, std::string_view client_address);

}  // namespace dplb::http
