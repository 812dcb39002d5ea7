#pragma once
// A small blocking HTTP/1.1 client for integration tests, built on Beast: every call is bounded by a
// deadline, scaled by the timing slack (an expired deadline fails the call, it never hangs a test), keeps
// the connection alive across calls, and can record when each piece of a streamed body arrived.

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace dplb::test {

namespace bhttp = boost::beast::http;
using steady = std::chrono::steady_clock;

struct http_response {
  unsigned status = 0;
  bhttp::fields headers;
  std::string body;
  bool keep_alive = false;
  bool complete = false;                 // the whole message arrived (not cut short)
  std::string error;                     // empty on success
  // Streaming only: each body piece as it was read, with its arrival time.
  std::vector<std::pair<steady::time_point, std::string>> pieces;
  steady::time_point head_at{};          // when the response head arrived
};

// One response as it crossed the wire, split off a byte stream by its own framing, for tests that must
// see exactly what a client got (interim responses, framing headers, bytes after a body).
struct raw_response {
  std::string raw;      // every byte of this message: head, then the body as framed
  std::string head;     // status line to the blank line included
  std::string version;  // "HTTP/1.1"
  unsigned status = 0;
  std::vector<std::pair<std::string, std::string>> fields;  // in order, values trimmed
  std::string body;     // decoded (chunk framing removed)
  bool chunked = false;
  bool complete = false;       // the whole message is there (its framing said where it ends)
  bool close_delimited = false;  // neither Content-Length nor chunked: the body ends when the connection does

  // 1xx other than 101: a client skips these and keeps waiting for the final response.
  bool interim() const { return status >= 100 && status < 200 && status != 101; }
  std::optional<std::string> header(std::string_view name) const;  // the first value
  std::size_t header_count(std::string_view name) const;
};

// Splits bytes into the responses they hold, in order. `answers_head[i]` says the i-th final response
// answers a HEAD request (no body, whatever its Content-Length). `closed`: the stream ended after these
// bytes, which completes a body delimited by the close. An unfinished last response is included with
// complete == false; bytes that do not start with "HTTP/" end the split (they are left unconsumed).
struct raw_split {
  std::vector<raw_response> responses;
  std::size_t consumed = 0;  // bytes taken by the complete responses
};
raw_split split_responses(std::string_view bytes, const std::vector<bool>& answers_head = {}, bool closed = false);

// What one raw read returned.
struct raw_reply {
  std::string bytes;                    // every byte this read handed out
  std::vector<raw_response> responses;  // interim ones included, in order; maybe an unfinished last one
  bool closed = false;                  // the peer closed (or reset) the connection
  bool deadline_passed = false;

  std::vector<raw_response> final_responses() const;  // the complete non-interim ones
  bool has_interim() const;
};

class http_connection {
 public:
  explicit http_connection(std::uint16_t port, std::chrono::milliseconds deadline = std::chrono::seconds(5));
  ~http_connection();

  // Sends the request (Host and framing are set if missing) and reads the whole response.
  http_response send(bhttp::request<bhttp::string_body> request,
                     std::chrono::milliseconds deadline = std::chrono::seconds(30));
  // Same, but records each body piece as it arrives (for streams).
  http_response send_streaming(bhttp::request<bhttp::string_body> request,
                               std::chrono::milliseconds deadline = std::chrono::seconds(30));

  // Raw bytes, for framing tests: write exactly these bytes; read whatever arrives until the peer
  // closes or the deadline passes.
  void write_raw(std::string_view bytes);
  std::string read_until_close(std::chrono::milliseconds deadline);
  // Reads whatever arrives for `duration`, then stops reading and leaves the connection open (a client
  // that stalls). Returns the number of bytes read.
  std::size_t read_for(std::chrono::milliseconds duration);
  // Reads until `finals` complete final responses have arrived (interim ones are returned too, and
  // `answers_head` is as in split_responses), or the peer closes, or the deadline passes. Bytes after the
  // last of them stay buffered for the next call; after a close or a deadline every byte read is
  // returned. A deadline only stops reading: the connection stays open, to observe what comes next.
  raw_reply read_responses(std::size_t finals, std::chrono::milliseconds deadline,
                           const std::vector<bool>& answers_head = {});
  // Reads until the peer closes or the deadline passes; `closed` tells which.
  raw_reply read_to_close(std::chrono::milliseconds deadline);

  // Closes the socket now (the client "goes away").
  void close();
  bool is_open() const;

 private:
  template <class Op>
  void run_bounded(Op&& op, std::chrono::milliseconds deadline, http_response* response);

  boost::asio::io_context io_;
  boost::asio::ip::tcp::socket socket_;
  std::string read_buffer_storage_;
  std::string raw_pending_;  // bytes read by read_responses past the responses it returned
  std::uint16_t port_;
};

// Convenience: one request on a fresh connection.
http_response http_get(std::uint16_t port, const std::string& target,
                       std::chrono::milliseconds deadline = std::chrono::seconds(10));
http_response http_post_json(std::uint16_t port, const std::string& target, const std::string& json,
                             std::chrono::milliseconds deadline = std::chrono::seconds(30));

// Prometheus text -> value per series, keyed exactly as printed: `name{label="v",...}` (labels in the
// printed order) or `name` without labels.
std::map<std::string, double> parse_metrics(const std::string& text);
std::map<std::string, double> scrape_metrics(std::uint16_t port);

// FNV-1a 64 of the bytes, as 16 lowercase hex digits (the mock engine's echo uses the same).
std::string fnv1a64_hex(std::string_view bytes);

}  // namespace dplb::test
