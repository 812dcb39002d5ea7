#pragma once
// A small blocking HTTP/1.1 client for integration tests, built on Beast: every call is bounded by a
// deadline (an expired deadline fails the call, it never hangs a test), keeps the connection alive
// across calls, and can record when each piece of a streamed body arrived.

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <cstdint>
#include <map>
#include <string>
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

  // Closes the socket now (the client "goes away").
  void close();
  bool is_open() const;

 private:
  template <class Op>
  void run_bounded(Op&& op, std::chrono::milliseconds deadline, http_response* response);

  boost::asio::io_context io_;
  boost::asio::ip::tcp::socket socket_;
  std::string read_buffer_storage_;
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
