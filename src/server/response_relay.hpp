#pragma once
// Private to the session: the engine's response relayed to the client as it arrives. The head is written
// from the engine's (its fields copied through but for the hop-by-hop ones, with dplb's own framing,
// Connection and x-dplb-rank); the body follows read by read, exactly as the engine's framing delivered it, re-framed as
// chunks when the client gets it chunked. Each write gathers the head (the first time), the chunk framing
// and the data into one system call; nothing is collected. Each read and write stores its deadline for the
// worker's sweeper; none arms a timer.

#include <boost/asio/buffer.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/buffers_suffix.hpp>
#include <boost/beast/core/string.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/message.hpp>

#include <algorithm>
#include <array>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>

#include "dplb/config/settings.hpp"
#include "dplb/http/header_sanitizer.hpp"
#include "dplb/http/wire_format.hpp"
#include "dplb/metrics/usage_scanner.hpp"
#include "dplb/support/io_buffers.hpp"
#include "buffered_parse.hpp"
#include "write_now.hpp"
#include "request_accounting.hpp"
#include "upstream_exchange.hpp"

namespace dplb::server {

inline bool response_has_body(unsigned status, bool head_request) {
  return !head_request && !(status >= 100 && status < 200) && status != 204 && status != 304;
}

// The Connection header of a response dplb writes as HTTP/1.1: an HTTP/1.0 client closes unless it is
// told the connection stays open, an HTTP/1.1 client keeps it open unless it is told it closes.
inline std::string_view connection_field(bool keep_alive, unsigned client_version) {
  return !keep_alive ? "Connection: close\r\n" : client_version < 11 ? "Connection: keep-alive\r\n" : "";
}

class response_relay {
  // Compared with in every pass of the relay loop: made once, not from the enumeration each time.
  static inline const boost::system::error_code need_more = boost::beast::http::error::need_more;
  static inline const boost::system::error_code need_buffer = boost::beast::http::error::need_buffer;

 public:
  enum class result {
    complete,        // the whole response reached the client
    engine_failed,   // the engine closed, reset or fell silent before the end of its response
    client_failed,   // the client stopped reading or went away
  };

  // `framing`: the session's buffer for the head and chunk framing.
  response_relay(io::socket& client, socket_deadline& client_deadline, upstream_exchange& exchange,
                 const config::settings& settings, std::string& framing)
      : client_(client), client_deadline_(client_deadline), exchange_(exchange), settings_(settings),
        framing_(framing) {}

  // Writes the client's head from the engine's. Returns whether the client connection stays open after
  // this response.
  // The client's X-Request-Id (empty: it sent none): the engines got it made unique (request_id.hpp), and the
  // client's response carries its own, whether or not the engine echoed the id it got.
  void answer_request_id(std::string_view client_id) noexcept { client_request_id_ = client_id; }

  bool prepare_head(std::size_t rank, bool head_request, unsigned client_version, bool client_keep_alive) {
    namespace bhttp = boost::beast::http;
    const auto& parser = exchange_.response();
    const auto& head = exchange_.response_head();
    has_body_ = response_has_body(head.status, head_request);
    framing_.clear();
    http::append_status_line(framing_, head.status, head.reason);
    const http::connection_options options(head.fields);
    for (const auto& field : head.fields) {
      // The body's framing is dplb's, from the parser's view of the engine's message: a header the engine
      // sent can neither remove it nor contradict it. (Without a body, the Content-Length of a HEAD or a
      // 304 tells the size of what a GET would get, and goes through.)
      if (!http::crosses(field, options) || (has_body_ && field.name == bhttp::field::content_length) ||
          is_rank_field(field) || (!client_request_id_.empty() && boost::beast::iequals(field.name_string, "x-request-id"))) {
        continue;
      }
      http::append_field(framing_, field.name_string, field.value);
    }
    if (!client_request_id_.empty()) http::append_field(framing_, "X-Request-Id", client_request_id_);
    bool keep_client = client_keep_alive;
    if (has_body_) {
      if (const auto length = parser.content_length()) {
        framing_ += "Content-Length: ";
        http::append_decimal(framing_, static_cast<std::size_t>(*length));
        framing_ += "\r\n";
      } else if (client_version >= 11) {
        // Chunked, or delimited by the engine closing: relayed chunked to an HTTP/1.1 client...
        framing_ += "Transfer-Encoding: chunked\r\n";
        chunked_ = true;
      } else {
        keep_client = false;  // ...and delimited by dplb closing the connection for an HTTP/1.0 one
      }
    }
    framing_ += "x-dplb-rank: ";
    http::append_decimal(framing_, rank);
    framing_ += "\r\n";
    framing_ += connection_field(keep_client, client_version);
    framing_ += "\r\n";
    return keep_client;
  }

 private:
  // Starts a send of body bytes (none for the head alone), with the head before them the first time;
  // `last` ends the body (with the terminating chunk when chunked). What the kernel takes at once leaves
  // now, without a trip through the event loop (write_now.hpp); returns whether a rest is left for
  // write_rest(). Once a send starts, part of the response may be out.
  bool send_now(std::string_view data, bool last) {
    if (progress_ != progress::nothing_sent) framing_.clear();
    std::string_view tail;
    if (chunked_) {
      if (!data.empty()) http::append_chunk_header(framing_, data.size());
      static constexpr std::string_view end_and_last = "\r\n0\r\n\r\n";
      tail = data.empty() ? (last ? http::last_chunk : std::string_view{}) : (last ? end_and_last : http::chunk_end);
    }
    pieces_ = {boost::asio::buffer(framing_), boost::asio::buffer(data), boost::asio::buffer(tail)};
    progress_ = last ? progress::body_ended : progress::head_sent;
    const auto now = write_now(client_, pieces_);
    if (now.ec) client_failed_ = true;
    if (!now.rest_pending()) return false;
    rest_.emplace(pieces_);
    rest_->consume(now.written);
    client_deadline_.expires_after(settings_.client_write_timeout);
    return true;
  }

  // The rest of a send, to await (not a coroutine of its own); then rest_written().
  auto write_rest() { return boost::asio::async_write(client_, *rest_, io::as_result); }
  void rest_written(const boost::system::error_code& ec) noexcept {
    client_deadline_.expires_never();
    if (ec) client_failed_ = true;
  }

 public:
  // Relays the head and the body. The moment the engine has sent everything, the request is accounted
  // for (accounting.engine_finished), before the last bytes go to the client.
  io::task<result> run(request_accounting& accounting) {
    namespace bhttp = boost::beast::http;
    auto& parser = exchange_.response();
    auto& connection = exchange_.connection();

    metrics::usage_scanner usage;
    const bool count_usage = accounting.status() == 200;
    // A token budget's request: its stream's tokens are counted as they pass (a stream may report no usage).
    const bool count_events = count_usage && accounting.reckons_tokens();
    if (count_events) usage.count_stream_events();
    if (!has_body_ || parser.is_done()) {
      // No body to relay (HEAD, 204, 304, Content-Length: 0): accounted for now, then the head alone.
      accounting.engine_finished(usage);
      if (send_now({}, true)) {
        auto [ec, n] = co_await write_rest();
        rest_written(ec);
      }
      co_return client_failed_ ? result::client_failed : result::complete;
    }
    if (connection.buffer.size() == 0) {
      // Nothing of the body is here yet (a stream waiting for its first token): the head goes now so the
      // client sees the status at once. Otherwise it leaves together with the first body bytes.
      if (send_now({}, false)) {
        auto [ec, n] = co_await write_rest();
        rest_written(ec);
      }
      if (client_failed_) co_return result::client_failed;
    }
    bool last_read_filled = false;
    while (!parser.is_done()) {
      const auto sink = sink_.get();
      parser.set_sink(sink);
      // Bytes already read from the engine (a small response arrives whole with its head) are parsed
      // without I/O; the engine is read only when they are used up, or are a fragment (a chunk header
      // cut short) that cannot be parsed alone.
      auto ec = parse_buffered(parser, connection.buffer, [&] { return parser.is_done(); });
      if (ec == need_more && parser.sink_left() == sink.size()) {
        // Nothing to relay until the engine sends more: read, then parse again. The wait holds no large
        // block (a stream spends nearly all its life here, between two tokens): the relay's is given
        // back, and the engine is read into a small one unless more than that is known to be coming.
        sink_.release();
        const std::size_t read_size = engine_read_size(parser, last_read_filled);
        auto& buffer = connection.buffer;
        if (buffer.size() == 0 && buffer.capacity() != read_size) buffer.shrink_to_fit();  // swapped for one of that size
        auto& upstream_deadline = exchange_.deadline();
        upstream_deadline.expires_after(settings_.upstream_read_timeout);
        auto [read_ec, n] =
            co_await connection.stream.socket().async_read_some(buffer.prepare(read_size), io::as_result);
        upstream_deadline.expires_never();
        buffer.commit(n);
        last_read_filled = n == read_size;
        if (!read_ec) continue;
        if (read_ec != boost::asio::error::eof) co_return result::engine_failed;
        parser.put_eof(ec);  // ends a body delimited by the close, and is an error for any other
        if (ec) co_return result::engine_failed;
      }
      if (ec && ec != need_buffer && ec != need_more) co_return result::engine_failed;
      // (After a close that ended the body, the sink was given back for the read: nothing came.)
      const std::size_t got = sink_.held() ? sink.size() - parser.sink_left() : 0;
      const char* data = sink_.held() ? sink.data() : nullptr;
      if (count_usage) usage.feed({data, got});
      if (count_events) accounting.streamed(usage);
      if (got > 0) accounting.body_arrived();
      if (parser.is_done()) accounting.engine_finished(usage);
      if (got == 0 && !parser.is_done()) continue;  // a chunk header without data yet
      // A read that completes the body is always sent with `last`, even when it delivered no data, so the
      // client never misses the body's end.
      body_bytes_ += got;
      if (send_now({data, got}, parser.is_done())) {
        auto [write_ec, n] = co_await write_rest();
        rest_written(write_ec);
      }
      if (client_failed_) co_return result::client_failed;
    }
    co_return result::complete;
  }

  // Body bytes handed to the client's socket (the access log's "bytes").
  std::uint64_t body_bytes() const noexcept { return body_bytes_; }

  // Whether any byte of the response reached the client (after a failure: can it still get an error?).
  bool head_sent() const noexcept { return progress_ != progress::nothing_sent; }

 private:
  enum class progress { nothing_sent, head_sent, body_ended };

  // How much to read from the engine next. A small block holds most SSE events and small responses: a
  // stream waiting for its next token then holds 4 KiB, not 16. A large one when more is known to be
  // waiting: the last read filled what it asked for (a burst), or the Content-Length says so.
  static std::size_t engine_read_size(const upstream_exchange::response_parser& parser, bool last_read_filled) {
    if (last_read_filled) return io::large_block_size;
    const auto remaining = parser.content_length_remaining();
    return remaining && *remaining > io::small_block_size ? io::large_block_size : io::small_block_size;
  }

  // An x-dplb-rank the engine sent itself: the client must see dplb's, and only dplb's.
  static bool is_rank_field(const http::field_view& field) noexcept {
    return field.name == boost::beast::http::field::unknown && boost::beast::iequals(field.name_string, "x-dplb-rank");
  }

  io::socket& client_;
  socket_deadline& client_deadline_;
  upstream_exchange& exchange_;
  const config::settings& settings_;
  std::string& framing_;
  std::string_view client_request_id_;  // the client's X-Request-Id, for its response head (empty: none)
  io::buffer_block sink_{io::large_block_size};  // the body bytes of one read, de-chunked; held only to send them
  std::array<boost::asio::const_buffer, 3> pieces_;
  std::optional<boost::beast::buffers_suffix<std::array<boost::asio::const_buffer, 3>>> rest_;
  std::uint64_t body_bytes_ = 0;
  bool client_failed_ = false;
  bool has_body_ = false;
  bool chunked_ = false;
  progress progress_ = progress::nothing_sent;
};

}  // namespace dplb::server
