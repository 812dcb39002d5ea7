#pragma once
// Header rules of an HTTP/1.1 intermediary (RFC 9110 7.6.1, RFC 9112 6): what must not cross dplb, and
// which request framings are ambiguous enough to be refused. Pure functions over a head's field views.

#include <cstddef>
#include <optional>
#include <string_view>

#include "dplb/http/message_head.hpp"

namespace dplb::http {

// The hop-by-hop headers by name: Connection, Keep-Alive, Proxy-Connection, TE, Transfer-Encoding, Upgrade,
// and Proxy-Authorization and Proxy-Authenticate (meant for a proxy, never for the engine). Framing
// (Content-Length, chunked) is always re-applied by dplb from the parser's view of the message.
bool is_hop_by_hop(boost::beast::http::field name) noexcept;

// The options a head's Connection lines list (RFC 9110 7.6.1): names of more hop-by-hop headers, read once
// per head. Their number is bounded, so that stripping costs at most fields x max_options comparisons: a
// head listing more (no real sender does) is refused rather than scanned, since thousands of options
// against thousands of fields would cost a second of CPU per request.
class connection_options {
 public:
  static constexpr std::size_t max_options = 32;

  explicit connection_options(const field_list& fields) noexcept;

  bool too_many() const noexcept { return too_many_; }
  // Whether the head's Connection names this field. Never Content-Length: a message's length is not the
  // sender's to name away, and dropping it would leave the other side without framing.
  bool names(std::string_view field_name) const noexcept;

 private:
  // Left uninitialised past count_: most heads list nothing, and zeroing 32 views for each would cost more
  // than the rest of the look.
  struct option {
    const char* data;
    std::size_t size;
  };
  option options_[max_options];
  std::size_t count_ = 0;
  bool too_many_ = false;
};

// Whether a field crosses dplb: not hop-by-hop by name, nor named by the head's Connection.
inline bool crosses(const field_view& field, const connection_options& options) noexcept {
  return !is_hop_by_hop(field.name) && !options.names(field.name_string);
}

// Why a request's framing is refused, or nullopt when it is unambiguous.
struct framing_problem {
  unsigned status;           // 400, or 501 for a transfer coding dplb does not implement
  std::string_view message;  // for the client, in the error JSON
};

// Refuses what request smuggling relies on: Content-Length together with Transfer-Encoding,
// Content-Length repeated or not a plain decimal number, any transfer coding other than a single
// "chunked".
std::optional<framing_problem> check_request_framing(const field_list& fields) noexcept;

// Where a head ends in raw bytes, and whether it folds a header line (obs-fold: a line that starts with
// a space or tab continues the previous one). A scan resumes from the previous incomplete result, so that
// a head arriving in many small reads is not rescanned from the start.
struct head_scan {
  bool complete = false;      // an empty line ("\r\n\r\n", or "\n\n") ends the head
  bool folded = false;        // a fold was seen (in the whole head, when complete)
  std::size_t length = 0;     // bytes of the head including the empty line, when complete
  std::size_t searched = 0;   // resume point for the next scan, when not complete
};
head_scan find_head_end(std::string_view bytes, const head_scan& resume = {}) noexcept;

// Longest X-Forwarded-For or Via value dplb will send (Beast refuses field values near 64 KiB).
inline constexpr std::size_t max_forwarding_header_bytes = 16 * 1024;

// Calls `item` with each non-empty item of a comma-separated list (RFC 9110 5.6.1), whitespace trimmed.
template <class Fn>
void for_each_list_item(std::string_view list, Fn&& item) {
  constexpr auto is_space = [](char c) { return c == ' ' || c == '\t'; };
  while (!list.empty()) {
    const auto comma = list.find(',');
    auto piece = list.substr(0, comma);
    while (!piece.empty() && is_space(piece.front())) piece.remove_prefix(1);
    while (!piece.empty() && is_space(piece.back())) piece.remove_suffix(1);
    if (!piece.empty()) item(piece);
    if (comma == std::string_view::npos) break;
    list.remove_prefix(comma + 1);
  }
}

}  // namespace dplb::http
