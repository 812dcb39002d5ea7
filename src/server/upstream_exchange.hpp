#pragma once
// Private to the session: one request's exchange with an engine, up to the engine's final response head.
// A connection from the worker's pool (or a new one), the request written in one gathered write, interim
// responses read and dropped, the keep-alive race re-sent once. The exchange then owns the connection and
// the response parser for the relay, and gives the connection back to the pool only when it is clean.

#include <boost/asio/buffer.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/buffers_suffix.hpp>
#include <boost/beast/http/error.hpp>

#include <array>
#include <chrono>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>

#include "dplb/http/header_sanitizer.hpp"
#include "dplb/http/message_head.hpp"
#include "dplb/server/admission.hpp"
#include "dplb/server/deadline_sweeper.hpp"
#include "dplb/server/proxy_context.hpp"
#include "dplb/upstream/health_monitor.hpp"
#include "buffered_parse.hpp"
#include "client_watch.hpp"
#include "write_now.hpp"

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
  using response_parser = http::response_head_parser;

  // How an attempt on a rank ended.
  struct outcome {
    boost::system::error_code ec;  // empty: the final response head is in response()
    std::string_view kind;         // one of metrics::upstream_error_kinds, or "client" (the client left)
    upstream::request_outcome health = upstream::request_outcome::success;
    bool retry_elsewhere = false;  // the engine never took the request: another rank may have it
  };

  // `response_head`: the session's, reused by every request; it holds views into the engine connection's
  // buffer, valid until the relay reads from the engine again.
  // `deadline`: the session's, for the engine connection in use; it guards nothing once the exchange ends.
  upstream_exchange(worker_state& worker, client_watch& watch, http::response_head& response_head,
                    socket_deadline& deadline)
      : worker_(worker), settings_(worker.shared.settings), watch_(watch), response_head_(response_head),
        deadline_(deadline) {}
  ~upstream_exchange() { deadline_.guard(nullptr); }
  upstream_exchange(const upstream_exchange&) = delete;
  upstream_exchange& operator=(const upstream_exchange&) = delete;

  // Sends the request (its head without the Host, and its body) to the rank and reads the final response
  // head.
  io::task<outcome> send(std::size_t rank, const upstream_head& head, std::string_view body, bool head_request) {
    const upstream::rank_entry& target = worker_.shared.topology.ranks()[rank];
    using clock_type = std::chrono::steady_clock;
    const auto head_timeout = settings_.upstream_first_byte_timeout.count() > 0 ? settings_.upstream_first_byte_timeout
                                                                                : settings_.upstream_read_timeout;
    for (int attempt = 0;; ++attempt) {
      watch_.upstream = nullptr;  // the watcher must never see a connection that is about to be destroyed
      deadline_.guard(nullptr);   // nor the deadline
      // A re-send always takes a fresh connection: the engine may have dropped every pooled one (restart).
      connection_ = attempt == 0 ? worker_.pool.take_idle(target.backend) : nullptr;
      if (!connection_) {
        auto connected = co_await worker_.pool.connect(target.backend);
        if (!connected.connection) {
          // Nothing was sent: always safe to try another rank.
          co_return outcome{connected.error, "connect", upstream::request_outcome::connect_failure, true};
        }
        connection_ = std::move(connected.connection);
        worker_.shared.metrics.upstream_connected(rank);
      }
      watch_.upstream = connection_.get();
      deadline_.guard(&connection_->stream.socket());
      if (watch_.client_gone) co_return outcome{boost::asio::error::operation_aborted, "client", {}, false};

      deadline_.expires_after(settings_.upstream_read_timeout);
      const auto pieces = head.pieces(target.request_lines, body);
      auto& socket = connection_->stream.socket();
      const auto now = write_now(socket, pieces);  // usually the whole request, without the event loop
      boost::system::error_code ec = now.ec;
      if (now.rest_pending()) {
        boost::beast::buffers_suffix rest(pieces);
        rest.consume(now.written);
        std::tie(ec, std::ignore) = co_await boost::asio::async_write(socket, rest, io::as_result);
      }
      const auto sent_at = clock_type::now();
      bool answered = false;  // some byte of a response (interim or final) arrived
      if (!ec) {
        // The final response head, after any interim ones (read here, not in a coroutine of their own).
        deadline_.expires_after(head_timeout);
        for (int interim = 0;; ++interim) {
          head_reader reader(connection_->buffer, settings_.max_header_bytes);
          ec = reader.scan();
          while (ec == head_reader::need_more) {
            auto [read_ec, n] = co_await connection_->stream.socket().async_read_some(reader.space(), io::as_result);
            ec = reader.read(read_ec, n);
          }
          answered = answered || connection_->buffer.size() > 0;
          if (ec || parse_head(head_request, interim, ec) == head_kind::final) break;
        }
      }
      deadline_.expires_never();
      if (ec && deadline_.expired()) ec = boost::beast::error::timeout;
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
        // Reset or closed on a fresh connection before any answer, within the window: the engine refused it
        // (an engine shutting down, a full accept queue), and another rank may take it. The request may
        // also have reached an engine that then crashed on it; sending it on could crash the next rank
        // too (a "query of death"). That is bounded by --max-retries ranks, and by the window: an engine
        // that worked on a request for longer than that is never retried. (HAProxy retries only connect
        // failures by default; Envoy, resets only when asked. dplb keeps this retry because an engine
        // restarting under load resets in exactly this way, and the client would otherwise see a 502.)
        co_return outcome{ec, "reset", upstream::request_outcome::reset, true};
      }
      co_return outcome{ec, "protocol", upstream::request_outcome::reset, false};
    }
  }

  upstream::upstream_connection& connection() noexcept { return *connection_; }
  response_parser& response() noexcept { return *parser_; }
  const http::response_head& response_head() const noexcept { return response_head_; }
  socket_deadline& deadline() noexcept { return deadline_; }

  // After a complete relay: the connection goes back to the pool only when its response ended cleanly,
  // the engine keeps it alive (the parser's view, which is false for a body that ends when the engine
  // closes), and it holds no byte beyond that response. Anything else would hand its leftovers to the next
  // client as an answer. (A deadline that passed as the last read completed has closed the socket.)
  void give_back_if_clean(std::size_t rank) {
    if (parser_->is_done() && parser_->keep_alive() && connection_->buffer.size() == 0 &&
        connection_->stream.socket().is_open()) {
      deadline_.guard(nullptr);
      watch_.upstream = nullptr;  // the watcher must never close a connection another request may take
      worker_.pool.give_back(worker_.shared.topology.ranks()[rank].backend, std::move(connection_));
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

  enum class head_kind { final, interim };

  // Parses the response head whole in the connection's buffer into a fresh parser, without I/O, as views
  // of the buffer. Interim responses (100 Continue, 102, 103 Early Hints) are dropped: dplb answered the
  // client's Expect itself, and clients such as Python's http.client take a 103 for the final response. A
  // 101 is refused: dplb strips Upgrade, so the engine was never asked to switch protocols, and the
  // connection is not reusable after one. So is a head whose Connection lists more options than dplb
  // strips (http::connection_options). `ec` is set for a head refused.
  head_kind parse_head(bool head_request, int interim, boost::system::error_code& ec) {
    namespace bhttp = boost::beast::http;
    parser_.emplace(response_head_);
    parser_->header_limit(static_cast<std::uint32_t>(settings_.max_header_bytes));
    parser_->body_limit(boost::none);  // responses stream through; nothing is collected
    if (head_request) parser_->skip(true);
    ec = parse_buffered(*parser_, connection_->buffer, [&] { return parser_->is_header_done(); });
    if (ec == bhttp::error::need_more) ec = bhttp::error::partial_message;
    if (ec) return head_kind::final;
    const unsigned status = response_head_.status;
    if (status >= 200) {
      if (http::connection_options(response_head_.fields).too_many()) ec = bhttp::error::bad_field;
      return head_kind::final;
    }
    if (status == 101 || interim == max_interim_responses) {
      ec = bhttp::error::bad_status;
      return head_kind::final;
    }
    return head_kind::interim;
  }

  worker_state& worker_;
  const config::settings& settings_;
  client_watch& watch_;
  http::response_head& response_head_;
  socket_deadline& deadline_;
  upstream::connection_ptr connection_;
  std::optional<response_parser> parser_;
};

}  // namespace dplb::server
