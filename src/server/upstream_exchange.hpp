#pragma once
// Private to the session: one request's exchange with an engine, up to the engine's final response head.
// A connection from the worker's pool (or a new one), the request written in one gathered write, interim
// responses read and dropped, the keep-alive race re-sent once. The exchange then owns the connection and
// the response parser for the relay, and gives the connection back to the pool only when it is clean.

#include <boost/asio/buffer.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/http/buffer_body.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/read.hpp>

#include <array>
#include <chrono>
#include <optional>
#include <string>
#include <string_view>

#include "dplb/http/wire_format.hpp"
#include "dplb/server/admission.hpp"
#include "dplb/server/proxy_context.hpp"
#include "dplb/upstream/health_monitor.hpp"
#include "client_watch.hpp"

namespace dplb::server {

// A pooled engine connection that closes without a byte of answer this soon after the request went out
// is the keep-alive race: the engine closed it while idle, before the request arrived, so the request is
// re-sent. A close later than this came from an engine that had the request and may have worked on it
// (a reset minutes into a generation): re-sending would run the generation again behind the client's
// back. A loopback or LAN round trip is far below this bound, even on a loaded machine.
inline constexpr auto keepalive_race_window = std::chrono::seconds(1);

// Interim (1xx) responses skipped before the final one; an engine that sends more is broken.
inline constexpr int max_interim_responses = 16;

class upstream_exchange {
 public:
  using response_parser = boost::beast::http::response_parser<boost::beast::http::buffer_body>;

  // How an attempt on a rank ended.
  struct outcome {
    boost::system::error_code ec;  // empty: the final response head is in response()
    std::string_view kind;         // one of metrics::upstream_error_kinds, or "client" (the client left)
    upstream::request_outcome health = upstream::request_outcome::success;
    bool retry_elsewhere = false;  // the engine never took the request: another rank may have it
  };

  // `request_head`: the session's buffer for the request head, reused by every request.
  upstream_exchange(worker_state& worker, client_watch& watch, std::string& request_head)
      : worker_(worker), settings_(worker.shared.settings), watch_(watch), request_head_(request_head) {}

  // Sends the request to the rank and reads the final response head.
  io::task<outcome> send(std::size_t rank, client_request& request, bool head_request) {
    using clock_type = std::chrono::steady_clock;
    namespace bhttp = boost::beast::http;
    request.set(bhttp::field::host, worker_.shared.backends[rank].authority);
    const auto head_timeout = settings_.upstream_first_byte_timeout.count() > 0 ? settings_.upstream_first_byte_timeout
                                                                                : settings_.upstream_read_timeout;
    for (int attempt = 0;; ++attempt) {
      watch_.upstream = nullptr;  // the watcher must never see a connection that is about to be destroyed
      // A re-send always takes a fresh connection: the engine may have dropped every pooled one (restart).
      connection_ = attempt == 0 ? worker_.pool.take_idle(rank) : nullptr;
      if (!connection_) {
        auto connected = co_await worker_.pool.connect(rank);
        if (!connected.connection) {
          // Nothing was sent: always safe to try another rank.
          co_return outcome{connected.error, "connect", upstream::request_outcome::connect_failure, true};
        }
        connection_ = std::move(connected.connection);
        worker_.shared.metrics.upstream_connected(rank);
      }
      watch_.upstream = connection_.get();
      if (watch_.client_gone) co_return outcome{boost::asio::error::operation_aborted, "client", {}, false};

      connection_->stream.expires_after(settings_.upstream_read_timeout);
      request_head_.clear();
      http::append_request_head(request_head_, request.base());
      const std::array<boost::asio::const_buffer, 2> pieces{boost::asio::buffer(request_head_),
                                                            boost::asio::buffer(request.body())};
      auto [write_ec, written] = co_await boost::asio::async_write(connection_->stream, pieces, io::as_result);
      const auto sent_at = clock_type::now();
      boost::system::error_code ec = write_ec;
      bool answered = false;  // some byte of a response (interim or final) arrived
      if (!ec) {
        connection_->stream.expires_after(head_timeout);
        ec = co_await read_final_head(head_request, answered);
      }
      if (!ec) co_return outcome{};
      if (watch_.client_gone) co_return outcome{ec, "client", {}, false};
      // Closed without a byte of answer right after the request went out: the engine never took it.
      const bool refused = !answered && is_closed_connection(ec) && clock_type::now() - sent_at < keepalive_race_window;
      if (connection_->reused && refused && attempt == 0) {
        worker_.shared.metrics.keepalive_retry(rank);
        continue;
      }
      if (ec == boost::beast::error::timeout) {
        // The engine has the request and may be working on it: sending it elsewhere would double the work.
        co_return outcome{ec, "timeout", upstream::request_outcome::timeout, false};
      }
      if (refused) {
        // Reset or closed on a fresh connection before any answer: the engine refused it.
        co_return outcome{ec, "reset", upstream::request_outcome::reset, true};
      }
      co_return outcome{ec, "protocol", upstream::request_outcome::reset, false};
    }
  }

  upstream::upstream_connection& connection() noexcept { return *connection_; }
  response_parser& response() noexcept { return *parser_; }

  // After a complete relay: the connection goes back to the pool only when its response ended cleanly,
  // the engine keeps it alive (the parser's view, which is false for a body that ends when the engine
  // closes), and it holds no byte beyond that response. Anything else would hand its leftovers to the next
  // client as an answer. (A watchdog that fired as the last read completed has closed the socket.)
  void give_back_if_clean(std::size_t rank) {
    if (parser_->is_done() && parser_->keep_alive() && connection_->buffer.size() == 0 &&
        connection_->stream.socket().is_open()) {
      worker_.pool.give_back(rank, std::move(connection_));
    }
  }

 private:
  // The engine closed (or reset) a connection without answering.
  static bool is_closed_connection(const boost::system::error_code& ec) {
    namespace asio = boost::asio;
    return ec == boost::beast::http::error::end_of_stream || ec == asio::error::eof ||
           ec == asio::error::connection_reset || ec == asio::error::broken_pipe ||
           ec == asio::error::connection_aborted;
  }

  // Reads the engine's final response head into a fresh parser. Interim responses (100 Continue, 102, 103
  // Early Hints) are read and dropped: dplb answered the client's Expect itself, and clients such as
  // Python's http.client take a 103 for the final response. A 101 is refused: dplb strips Upgrade, so the
  // engine was never asked to switch protocols, and the connection is not reusable after one.
  io::task<boost::system::error_code> read_final_head(bool head_request, bool& answered) {
    for (int interim = 0;; ++interim) {
      parser_.emplace();
      parser_->header_limit(static_cast<std::uint32_t>(settings_.max_header_bytes));
      parser_->body_limit(boost::none);  // responses stream through; nothing is collected
      if (head_request) parser_->skip(true);
      auto [ec, read] =
          co_await boost::beast::http::async_read_header(connection_->stream, connection_->buffer, *parser_, io::as_result);
      answered = answered || parser_->got_some();
      if (ec) co_return ec;
      const unsigned status = parser_->get().result_int();
      if (status >= 200) co_return boost::system::error_code{};
      if (status == 101 || interim == max_interim_responses) co_return boost::beast::http::error::bad_status;
    }
  }

  worker_state& worker_;
  const config::settings& settings_;
  client_watch& watch_;
  std::string& request_head_;
  upstream::connection_ptr connection_;
  std::optional<response_parser> parser_;
};

}  // namespace dplb::server
