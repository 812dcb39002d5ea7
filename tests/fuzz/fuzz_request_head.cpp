// libFuzzer target for what dplb does with the bytes a client sends, up to the request it sends an engine:
// dplb's request parser (http::request_head_parser, views into the input) with dplb's limits, fed as a
// socket would (in pieces, the parser asking for more), then the production code the session runs: the
// raw head scan that refuses obs-fold, admit() on the head, prepare_upstream_request(), the body read,
// set_upstream_framing() and the pieces of the gathered write (src/server/admission.cpp). Pipelined requests in one input are handled one
// after the other, as on a keep-alive connection.
//
// Invariants (a violation prints what and traps):
//  - framing: when check_request_framing accepts, there is at most one Content-Length and it is plain
//    digits, Transfer-Encoding is absent or exactly one "chunked", and Beast frames the body the same way
//    (the length dplb validated is the length Beast reads);
//  - hop-by-hop: in the engine's request no Connection, Keep-Alive, Proxy-Connection, TE,
//    Transfer-Encoding, Upgrade, Proxy-Authorization, Proxy-Authenticate header remains, nor any header
//    the client named in Connection (except Content-Length), and every other header is still there;
//  - forwarding: one X-Forwarded-For ending in the client address and keeping what was there, one Via
//    ending in "1.1 dplb", one X-Forwarded-Proto "http";
//  - trailers: a chunked body's trailer fields never join the head;
//  - the upstream request as written, parsed back by Beast's own parser, is exactly one request (no bytes
//    left over for a second one: no smuggling towards the engine) with the client's method, the admitted
//    target, HTTP/1.1, the rank's Host and the client's body;
//  - split invariance: the whole input fed at once and fed in pieces forward and refuse the same
//    requests (only the error that ends a connection may differ, see same_outcome()).
//
// DPLB_FUZZ_VERBOSE=1 prints what became of each request of an input; DPLB_FUZZ_HEADER_LIMIT=N parses
// with another --max-header-bytes.

#include <boost/beast/http.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "dplb/http/header_sanitizer.hpp"
#include "dplb/http/message_head.hpp"
#include "dplb/server/admission.hpp"

namespace {

namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
using upstream_request = bhttp::request<bhttp::string_body>;

// dplb's default --max-header-bytes; DPLB_FUZZ_HEADER_LIMIT=N replays an input with another limit (F4).
const std::uint32_t header_limit = [] {
  const char* v = std::getenv("DPLB_FUZZ_HEADER_LIMIT");
  return v ? static_cast<std::uint32_t>(std::strtoul(v, nullptr, 10)) : 64u * 1024;
}();
constexpr std::uint64_t body_limit = 1024 * 1024;    // smaller than dplb's 64 MiB: keeps runs fast
constexpr std::size_t max_requests_per_input = 16;
// A peer address as long as Asio writes them (a full IPv6 address, 39 characters; only a scope id is
// longer): forwarding headers near the size limits must still fit with it.
constexpr std::string_view client_address = "fe80:1234:5678:9abc:def0:1234:5678:9abc";
constexpr std::string_view upstream_authority = "127.0.0.1:8001";


[[noreturn]] void fail(const char* what, int line) {
  std::fprintf(stderr, "fuzz_request_head: invariant violated (line %d): %s\n", line, what);
  __builtin_trap();
}
#define FUZZ_CHECK(condition) ((condition) ? void() : fail(#condition, __LINE__))

bool iequals(std::string_view a, std::string_view b) { return beast::iequals(a, b); }

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// The non-empty items of a comma-separated header list (RFC 9110 5.6.1), OWS trimmed.
std::vector<std::string> list_items(std::string_view list) {
  std::vector<std::string> items;
  std::size_t start = 0;
  while (start <= list.size()) {
    const auto comma = list.find(',', start);
    const auto end = comma == std::string_view::npos ? list.size() : comma;
    const auto item = trim(list.substr(start, end - start));
    if (!item.empty()) items.emplace_back(item);
    start = end + 1;
  }
  return items;
}

bool is_hop_by_hop(std::string_view name, const std::vector<std::string>& named_in_connection) {
  static constexpr std::string_view always[] = {"connection", "keep-alive", "proxy-connection", "te",
                                                "transfer-encoding", "upgrade", "proxy-authorization",
                                                "proxy-authenticate"};
  for (auto h : always) {
    if (iequals(name, h)) return true;
  }
  // A Content-Length named in Connection stays: framing is never the sender's to name away.
  for (const auto& n : named_in_connection) {
    if (iequals(name, n) && !iequals(name, "content-length")) return true;
  }
  return false;
}

std::vector<std::string> values_of(const bhttp::fields& fields, std::string_view name) {
  std::vector<std::string> values;
  for (const auto& f : fields) {
    if (iequals(f.name_string(), name)) values.emplace_back(f.value());
  }
  return values;
}

std::vector<std::string> values_of(const dplb::http::field_list& fields, std::string_view name) {
  std::vector<std::string> values;
  for (const auto& f : fields) {
    if (iequals(f.name_string, name)) values.emplace_back(f.value);
  }
  return values;
}

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// Framing as accepted by check_request_framing must be framing Beast reads the same way.
void check_accepted_framing(const dplb::http::request_head_parser& parser, const dplb::http::request_head& head) {
  const auto lengths = values_of(head.fields, "content-length");
  const auto codings = values_of(head.fields, "transfer-encoding");
  FUZZ_CHECK(lengths.empty() || codings.empty());
  FUZZ_CHECK(lengths.size() <= 1);
  FUZZ_CHECK(codings.size() <= 1);
  if (lengths.size() == 1) {
    const auto& v = lengths.front();
    FUZZ_CHECK(!v.empty() && v.size() <= 19);
    FUZZ_CHECK(std::all_of(v.begin(), v.end(), [](char c) { return c >= '0' && c <= '9'; }));
    FUZZ_CHECK(parser.content_length().has_value());
    FUZZ_CHECK(*parser.content_length() == std::stoull(v));
    FUZZ_CHECK(!parser.chunked());
  }
  if (codings.size() == 1) {
    const auto items = list_items(codings.front());
    FUZZ_CHECK(items.size() == 1 && iequals(items.front(), "chunked"));
    FUZZ_CHECK(parser.chunked());
  }
  if (lengths.empty() && codings.empty()) {
    FUZZ_CHECK(!parser.chunked() && !parser.content_length().has_value());
  }
}

// The engine's request as the session writes it (the rank's Host, the framing, the body), parsed back by
// Beast's own parser: exactly one request, nothing left over.
upstream_request parse_upstream(const dplb::server::upstream_head& head, const std::string& body, std::string& wire) {
  const std::string host_line = "Host: " + std::string(upstream_authority) + "\r\n";
  wire.clear();
  for (const auto& piece : head.pieces(host_line, body)) wire.append(static_cast<const char*>(piece.data()), piece.size());
  bhttp::request_parser<bhttp::string_body> parser;
  parser.header_limit(UINT32_MAX);
  parser.body_limit(boost::none);
  parser.eager(true);
  beast::error_code ec;
  const auto used = parser.put(boost::asio::buffer(wire), ec);
  FUZZ_CHECK(!ec);
  FUZZ_CHECK(parser.is_done());
  FUZZ_CHECK(used == wire.size());
  return parser.release();
}

// The invariants of the engine's request against the client's head and body.
void check_upstream(const dplb::http::request_head& head, std::string_view target, const std::string& body,
                    const upstream_request& sent) {
  std::vector<std::string> named_in_connection;
  for (const auto& v : values_of(head.fields, "connection")) {
    for (auto& item : list_items(v)) named_in_connection.push_back(std::move(item));
  }
  FUZZ_CHECK(sent.method_string() == head.method_string);
  FUZZ_CHECK(sent.target() == target);
  FUZZ_CHECK(sent.version() == 11);
  FUZZ_CHECK(sent.body() == body);
  FUZZ_CHECK(!sent.chunked());
  FUZZ_CHECK(values_of(sent.base(), "host") == std::vector<std::string>{std::string(upstream_authority)});
  // Every header the client sent is still there, unchanged and in order, unless it is hop-by-hop, Expect,
  // or one that dplb rewrites (Host, the forwarding headers and the framing).
  const auto rewritten = [](std::string_view name) {
    return iequals(name, "host") || iequals(name, "expect") || iequals(name, "x-forwarded-for") ||
           iequals(name, "via") || iequals(name, "x-forwarded-proto") || iequals(name, "content-length");
  };
  for (const auto& f : sent.base()) FUZZ_CHECK(!is_hop_by_hop(f.name_string(), named_in_connection));
  for (const auto& f : head.fields) {
    if (is_hop_by_hop(f.name_string, named_in_connection) || rewritten(f.name_string)) continue;
    FUZZ_CHECK(values_of(sent.base(), f.name_string) == values_of(head.fields, f.name_string));
  }
  FUZZ_CHECK(sent.count(bhttp::field::expect) == 0);
  // Framed by Content-Length, which an empty body may go without (Beast leaves it off a bodiless GET).
  const auto lengths = values_of(sent.base(), "content-length");
  FUZZ_CHECK(lengths == std::vector<std::string>{std::to_string(body.size())} || (lengths.empty() && body.empty()));
  const auto forwarded = values_of(sent.base(), "x-forwarded-for");
  const auto via = values_of(sent.base(), "via");
  const auto proto = values_of(sent.base(), "x-forwarded-proto");
  FUZZ_CHECK(forwarded.size() == 1);
  FUZZ_CHECK(ends_with(forwarded.front(), client_address));
  FUZZ_CHECK(via.size() == 1);
  FUZZ_CHECK(ends_with(via.front(), "1.1 dplb"));
  FUZZ_CHECK(proto.size() == 1 && proto.front() == "http");
  // Every earlier hop is kept, in order: repeated lines are one comma-separated list (RFC 9110 5.3),
  // whose empty items mean nothing (5.6.1).
  const auto check_appended = [](const std::vector<std::string>& before, const std::string& after,
                                 std::string_view added) {
    std::vector<std::string> expected;
    for (const auto& v : before) {
      for (auto& item : list_items(v)) expected.push_back(std::move(item));
    }
    expected.emplace_back(added);
    FUZZ_CHECK(list_items(after) == expected);
  };
  check_appended(values_of(head.fields, "x-forwarded-for"), forwarded.front(), client_address);
  check_appended(values_of(head.fields, "via"), via.front(), "1.1 dplb");
}

// Refused with 431 (F3): only when a joined list would really be too long.
void check_forwarding_refusal(const dplb::http::request_head& head) {
  std::size_t longest = 0;
  for (const auto& v : values_of(head.fields, "x-forwarded-for")) longest += v.size() + 2;
  std::size_t longest_via = 0;
  for (const auto& v : values_of(head.fields, "via")) longest_via += v.size() + 2;
  FUZZ_CHECK(std::max(longest + client_address.size(), longest_via + 8) > dplb::http::max_forwarding_header_bytes);
}

// The client's bytes, made available up to one cut point at a time, as successive socket reads.
class wire_reader {
 public:
  wire_reader(std::string_view input, std::vector<std::size_t> cuts) : input_(input), cuts_(std::move(cuts)) {
    cuts_.push_back(input_.size());
    available_ = cuts_.front();
  }

  bool exhausted() const { return read_ == input_.size(); }
  std::size_t position() const { return read_; }

  // Puts bytes into the parser until done() holds; returns the parser's error, or need_more when the
  // input ends first.
  template <class Parser, class Done>
  beast::error_code pump(Parser& parser, Done done) {
    beast::error_code ec;
    while (!done()) {
      if (read_ == available_ && !read_more()) return bhttp::error::need_more;
      const auto used = parser.put(boost::asio::buffer(input_.data() + read_, available_ - read_), ec);
      read_ += used;
      if (ec == bhttp::error::need_more) {
        if (!read_more()) return ec;
        ec = {};
        continue;
      }
      if (ec) return ec;
    }
    return ec;
  }

 private:
  bool read_more() {
    while (next_cut_ < cuts_.size() && cuts_[next_cut_] <= available_) ++next_cut_;
    if (next_cut_ == cuts_.size()) return false;
    available_ = cuts_[next_cut_];
    return true;
  }

  std::string_view input_;
  std::vector<std::size_t> cuts_;
  std::size_t next_cut_ = 0;
  std::size_t read_ = 0;
  std::size_t available_ = 0;
};

// One client connection: every request in the input, as dplb would handle it. Returns a transcript of
// what happened to each, to compare the runs with different splits.
std::vector<std::string> serve_connection(std::string_view input, std::vector<std::size_t> cuts) {
  std::vector<std::string> transcript;
  wire_reader reader(input, std::move(cuts));
  dplb::http::request_head head;  // reused by every request, as in the session
  std::string body;
  dplb::server::upstream_head upstream;
  std::string wire;
  while (!reader.exhausted() && transcript.size() < max_requests_per_input) {
    body.clear();
    dplb::http::request_head_parser parser(head, body);
    parser.header_limit(header_limit);
    parser.body_limit(body_limit);
    parser.eager(false);  // stop after the head

    // As the session's read_head: a whole head that folds a line is refused before it is parsed.
    const auto scan = dplb::http::find_head_end(input.substr(reader.position()));
    if (scan.complete && scan.folded && scan.length <= header_limit) {
      transcript.push_back("refused 400 (obs-fold)");
      break;
    }
    if (auto ec = reader.pump(parser, [&] { return parser.is_header_done(); })) {
      transcript.push_back("head error: " + ec.message());
      break;
    }
    const auto decision = dplb::server::admit(head);
    if (decision.refused()) {
      const auto status = decision.refusal_status;
      FUZZ_CHECK(status == 400 || status == 405 || status == 501);
      FUZZ_CHECK(!decision.refusal_message.empty());
      transcript.push_back("refused " + std::to_string(status));
      break;  // dplb answers and closes
    }
    check_accepted_framing(parser, head);
    const auto target = decision.target();
    FUZZ_CHECK(!target.empty() && (target.front() == '/' || target == "*"));
    const bool prepared = dplb::server::prepare_upstream_request(head, target, client_address, upstream);
    if (!prepared) check_forwarding_refusal(head);

    const auto head_fields = head.fields.size();
    parser.eager(true);
    if (auto ec = reader.pump(parser, [&] { return parser.is_done(); })) {
      transcript.push_back("body error: " + ec.message());
      break;
    }
    if (const auto length = values_of(head.fields, "content-length"); !length.empty()) {
      FUZZ_CHECK(body.size() == std::stoull(length.front()));
    }
    FUZZ_CHECK(head.fields.size() == head_fields);  // no trailer field joined the head
    if (!prepared) {
      transcript.push_back("refused 431");
      break;
    }
    dplb::server::set_upstream_framing(upstream, head.method, body.size());
    const auto sent = parse_upstream(upstream, body, wire);
    check_upstream(head, target, body, sent);
    transcript.push_back("forwarded: " + wire);
  }
  return transcript;
}

bool is_error(const std::string& entry) { return entry.starts_with("head error") || entry.starts_with("body error"); }

// Fed in pieces, Beast stops parsing a head until its end has arrived (it then parses from the start):
// a malformed head may be refused later, with another error (a head without its end may never be),
// as on a real connection. Both runs must forward and refuse the same requests; only the error that
// ends the connection may differ.
bool same_outcome(const std::vector<std::string>& whole, const std::vector<std::string>& pieces) {
  if (whole == pieces) return true;
  if (whole.size() != pieces.size() || whole.empty()) return false;
  if (!std::equal(whole.begin(), whole.end() - 1, pieces.begin())) return false;
  return is_error(whole.back()) && is_error(pieces.back());
}

std::uint64_t splitmix64(std::uint64_t& state) {
  std::uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);

  const auto whole = serve_connection(input, {});
  static const bool verbose = std::getenv("DPLB_FUZZ_VERBOSE") != nullptr;  // to see what became of an input
  if (verbose) {
    for (const auto& t : whole) std::fprintf(stderr, "%s\n", t.c_str());
  }

  // 1-4 cut points from a hash of the input, so seeds stay plain HTTP and each mutation reads differently.
  std::uint64_t seed = 1469598103934665603ull;
  for (unsigned char c : input) seed = (seed ^ c) * 1099511628211ull;
  std::vector<std::size_t> cuts(1 + splitmix64(seed) % 4);
  for (auto& cut : cuts) cut = size ? splitmix64(seed) % (size + 1) : 0;
  std::sort(cuts.begin(), cuts.end());
  const auto pieces = serve_connection(input, cuts);

  if (!same_outcome(whole, pieces)) {
    std::fprintf(stderr, "fuzz_request_head: fed whole and fed in %zu pieces differ\n", cuts.size() + 1);
    for (auto c : cuts) std::fprintf(stderr, "  cut at %zu\n", c);
    for (const auto& t : whole) std::fprintf(stderr, "  whole:  %.200s\n", t.c_str());
    for (const auto& t : pieces) std::fprintf(stderr, "  pieces: %.200s\n", t.c_str());
    __builtin_trap();
  }
  return 0;
}
