#include "dplb/server/session.hpp"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/buffer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <optional>
#include <spdlog/spdlog.h>

#include "dplb/http/error_response.hpp"
#include "dplb/http/header_sanitizer.hpp"
#include "dplb/metrics/usage_scanner.hpp"

namespace dplb::server {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
using tcp = asio::ip::tcp;
using clock_type = std::chrono::steady_clock;

namespace {

constexpr auto as_result = asio::as_tuple(asio::use_awaitable);

// One relay read's worth of body. 16 KiB holds many SSE events (each a few hundred bytes) so that a
// burst that arrived together leaves in one write, while 10,000 streaming sessions cost 160 MiB at most.
constexpr std::size_t relay_buffer_size = 16 * 1024;

using client_request = bhttp::request<bhttp::string_body>;

bool iequals(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return (x | 0x20) == (y | 0x20);
         });
}

std::string_view path_of(std::string_view target) { return target.substr(0, target.find('?')); }

// The engine closed (or reset) a connection without answering: the classic keep-alive race when the
// connection came from the pool.
bool is_closed_connection(const boost::system::error_code& ec) {
  return ec == bhttp::error::end_of_stream || ec == asio::error::eof || ec == asio::error::connection_reset ||
         ec == asio::error::broken_pipe || ec == asio::error::connection_aborted;
}

bool response_has_body(unsigned status, bool head_request) {
  return !head_request && !(status >= 100 && status < 200) && status != 204 && status != 304;
}

class session {
 public:
  session(worker_state& worker, tcp::socket socket)
      : worker_(worker), shared_(worker.shared), settings_(worker.shared.settings), client_(std::move(socket)),
        buffer_(settings_.max_header_bytes + 64 * 1024) {
    boost::system::error_code ec;
    auto remote = client_.socket().remote_endpoint(ec);
    client_address_ = ec ? "unknown" : remote.address().to_string();
    client_.socket().set_option(tcp::no_delay(true), ec);
  }

  asio::awaitable<void> run() {
    shared_.metrics.client_connection_opened();
    struct closed_on_exit {
      metrics::proxy_metrics& m;
      ~closed_on_exit() { m.client_connection_closed(); }
    } count_guard{shared_.metrics};

    while (co_await serve_one_request()) {
    }
    boost::system::error_code ec;
    client_.socket().shutdown(tcp::socket::shutdown_send, ec);
    client_.socket().close(ec);
  }

 private:
  // Reads and answers one request. Returns whether the connection stays open for another.
  asio::awaitable<bool> serve_one_request() {
    bhttp::request_parser<bhttp::string_body> parser;
    parser.header_limit(static_cast<std::uint32_t>(settings_.max_header_bytes));
    parser.body_limit(settings_.max_request_body_bytes);

    client_.expires_after(settings_.client_idle_timeout);
    auto [ec, unused] = co_await bhttp::async_read_header(client_, buffer_, parser, as_result);
    if (ec) co_return co_await refuse_unreadable_request(ec, parser.got_some());

    auto& request = parser.get();
    if (auto problem = http::check_request_framing(request)) {
      // The body's end cannot be known: answer and close, never guess.
      co_return co_await reject(problem->status, problem->message, false);
    }
    if (iequals(request[bhttp::field::expect], "100-continue")) {
      // dplb reads the whole body before choosing a rank (so a request can be re-sent), so it answers
      // the client's Expect itself; without this, curl and others stall a second before sending.
      static constexpr std::string_view continue_line = "HTTP/1.1 100 Continue\r\n\r\n";
      client_.expires_after(settings_.client_write_timeout);
      auto [wec, wn] = co_await asio::async_write(client_, asio::buffer(continue_line), as_result);
      if (wec) co_return false;
    }
    client_.expires_after(settings_.request_read_timeout);
    auto [body_ec, body_bytes] = co_await bhttp::async_read(client_, buffer_, parser, as_result);
    if (body_ec) co_return co_await refuse_unreadable_request(body_ec, true);

    const bool keep_alive = request.keep_alive();
    const auto path = path_of(request.target());
    if (path == "/metrics" || path == "/health") co_return co_await serve_own_path(request, path, keep_alive);
    co_return co_await proxy(request, keep_alive);
  }

  asio::awaitable<bool> refuse_unreadable_request(const boost::system::error_code& ec, bool got_some) {
    if (ec == bhttp::error::header_limit) {
      co_return co_await reject(431, "request head exceeds the limit (--max-header-bytes)", false);
    }
    if (ec == bhttp::error::body_limit) {
      co_return co_await reject(413, "request body exceeds the limit (--max-request-body-bytes)", false);
    }
    if (ec == beast::error::timeout && got_some) {
      co_return co_await reject(408, "request not received in time (--request-read-timeout-ms)", false);
    }
    if (ec.category() == bhttp::make_error_code(bhttp::error::bad_version).category() &&
        ec != bhttp::error::end_of_stream && ec != bhttp::error::partial_message) {
      co_return co_await reject(400, "malformed HTTP request: " + ec.message(), false);
    }
    co_return false;  // the client went away or stayed idle: close quietly
  }

  asio::awaitable<bool> reject(unsigned status, std::string_view message, bool keep_alive) {
    shared_.metrics.rejected(status);
    co_return co_await send_error(status, message, keep_alive);
  }

  asio::awaitable<bool> send_error(unsigned status, std::string_view message, bool keep_alive,
                                   bool retry_later = false) {
    bhttp::response<bhttp::string_body> response{static_cast<bhttp::status>(status), 11};
    response.set(bhttp::field::content_type, "application/json");
    if (retry_later) response.set(bhttp::field::retry_after, "1");
    response.body() = http::error_body(status, message);
    co_return co_await send_local(response, keep_alive, false);
  }

  asio::awaitable<bool> send_local(bhttp::response<bhttp::string_body>& response, bool keep_alive,
                                   bool head_request) {
    response.keep_alive(keep_alive);
    response.prepare_payload();
    if (head_request) response.body().clear();  // Content-Length still tells the size of a GET
    client_.expires_after(settings_.client_write_timeout);
    auto [ec, n] = co_await bhttp::async_write(client_, response, as_result);
    co_return !ec && keep_alive;
  }

  asio::awaitable<bool> serve_own_path(const client_request& request, std::string_view path, bool keep_alive) {
    const bool head_request = request.method() == bhttp::verb::head;
    if (request.method() != bhttp::verb::get && !head_request) {
      bhttp::response<bhttp::string_body> response{bhttp::status::method_not_allowed, 11};
      response.set(bhttp::field::allow, "GET, HEAD");
      response.set(bhttp::field::content_type, "application/json");
      response.body() = http::error_body(405, std::string(path) + " only answers GET");
      co_return co_await send_local(response, keep_alive, false);
    }
    bhttp::response<bhttp::string_body> response{bhttp::status::ok, 11};
    if (path == "/metrics") {
      response.set(bhttp::field::content_type, "text/plain; version=0.0.4; charset=utf-8");
      response.body() = shared_.metrics.render();
    } else if (!shared_.balancer.any_usable()) {
      response.result(bhttp::status::service_unavailable);
      response.set(bhttp::field::content_type, "application/json");
      response.body() = http::error_body(503, "no backend rank is usable");
    }
    co_return co_await send_local(response, keep_alive, head_request);
  }

  // Picks a rank, sends it the request and relays the response. Returns whether the client
  // connection may carry another request.
  asio::awaitable<bool> proxy(client_request& request, bool client_keep_alive) {
    auto lease = shared_.balancer.acquire();
    if (!lease) {
      shared_.metrics.rejected(503);
      co_return co_await send_error(503, "no backend rank is usable; check the engines and their /health",
                                    client_keep_alive, true);
    }
    const std::size_t rank = lease.rank();
    const auto& backend = shared_.backends[rank];
    const auto picked_at = clock_type::now();
    const bool head_request = request.method() == bhttp::verb::head;
    const bool client_understands_chunked = request.version() >= 11;

    prepare_upstream_request(request, backend);

    // Send the request; a pooled connection that turns out closed before any response byte is the
    // keep-alive race (the engine closed it while idle): re-send on a fresh connection.
    upstream::connection_ptr connection;
    std::optional<bhttp::response_parser<bhttp::buffer_body>> parser;
    for (int attempt = 0;; ++attempt) {
      // A retry always takes a fresh connection: the engine may have dropped every pooled one (restart).
      connection = attempt == 0 ? worker_.pool.take_idle(rank) : nullptr;
      if (!connection) {
        auto connected = co_await worker_.pool.connect(rank);
        if (!connected.connection) {
          co_return co_await fail_before_response(rank, picked_at, connected.error, "connect to", client_keep_alive);
        }
        connection = std::move(connected.connection);
        shared_.metrics.upstream_connected(rank);
      }
      parser.emplace();
      parser->header_limit(static_cast<std::uint32_t>(settings_.max_header_bytes));
      parser->body_limit(boost::none);  // responses stream through; nothing is collected
      if (head_request) parser->skip(true);

      connection->stream.expires_after(settings_.upstream_read_timeout);
      auto [write_ec, written] = co_await bhttp::async_write(connection->stream, request, as_result);
      boost::system::error_code ec = write_ec;
      if (!ec) {
        auto [read_ec, read] = co_await bhttp::async_read_header(connection->stream, connection->buffer, *parser, as_result);
        ec = read_ec;
      }
      if (!ec) break;
      if (connection->reused && !parser->got_some() && is_closed_connection(ec) && attempt < 2) {
        shared_.metrics.keepalive_retry(rank);
        continue;
      }
      co_return co_await fail_before_response(rank, picked_at, ec, "get a response from", client_keep_alive);
    }
    shared_.metrics.first_byte(rank, clock_type::now() - picked_at);

    // The response head for the client: the engine's, minus hop-by-hop headers, with dplb's own framing.
    auto& upstream_head = parser->get();
    const unsigned status = upstream_head.result_int();
    const bool upstream_keep_alive = upstream_head.keep_alive();
    const bool has_body = response_has_body(status, head_request);
    bhttp::response<bhttp::buffer_body> out;
    out.result(status);
    out.version(11);
    for (const auto& field : upstream_head) out.insert(field.name(), field.name_string(), field.value());
    http::strip_hop_by_hop(out);
    bool keep_client = client_keep_alive;
    if (has_body && !parser->content_length()) {
      // Chunked, or delimited by the engine closing: relay as chunked to an HTTP/1.1 client; an
      // HTTP/1.0 client gets the body delimited by dplb closing the connection.
      if (client_understands_chunked) {
        out.chunked(true);
      } else {
        keep_client = false;
      }
    }
    out.set("x-dplb-rank", std::to_string(rank));
    out.keep_alive(keep_client);

    bhttp::response_serializer<bhttp::buffer_body> serializer{out};
    metrics::usage_scanner usage;
    const bool count_usage = status == 200;
    bool upstream_ok = true;
    bool client_ok = true;

    if (!has_body || connection->buffer.size() == 0) {
      // Nothing of the body is here yet (a stream waiting for its first token): the head goes now so the
      // client sees the status at once. Otherwise it leaves together with the first body bytes.
      client_.expires_after(settings_.client_write_timeout);
      auto [ec, n] = co_await bhttp::async_write_header(client_, serializer, as_result);
      client_ok = !ec;
    }
    char* relay = relay_buffer();
    while (client_ok && has_body && !parser->is_done()) {
      parser->get().body().data = relay;
      parser->get().body().size = relay_buffer_size;
      connection->stream.expires_after(settings_.upstream_read_timeout);
      auto [read_ec, read] = co_await bhttp::async_read_some(connection->stream, connection->buffer, *parser, as_result);
      if (read_ec && read_ec != bhttp::error::need_buffer) {
        upstream_ok = false;
        break;
      }
      const std::size_t got = relay_buffer_size - parser->get().body().size;
      if (got == 0 && !parser->is_done()) continue;  // a chunk header without data yet
      if (count_usage) usage.feed({relay, got});
      out.body().data = got ? relay : nullptr;
      out.body().size = got;
      out.body().more = !parser->is_done();
      client_.expires_after(settings_.client_write_timeout);
      auto [write_ec, written] = co_await bhttp::async_write(client_, serializer, as_result);
      client_ok = !write_ec || write_ec == bhttp::error::need_buffer;
    }
    if (client_ok && upstream_ok && !serializer.is_done()) {
      out.body().data = nullptr;
      out.body().size = 0;
      out.body().more = false;
      client_.expires_after(settings_.client_write_timeout);
      auto [ec, n] = co_await bhttp::async_write(client_, serializer, as_result);
      client_ok = !ec || ec == bhttp::error::need_buffer;
    }

    const auto duration = clock_type::now() - picked_at;
    if (!upstream_ok) {
      // Part of the response is already out: closing without the terminating chunk (or short of the
      // Content-Length) is the only way left to tell the client the response is incomplete.
      shared_.metrics.upstream_failed_midstream(rank);
      shared_.metrics.request_finished(rank, status, duration);
      spdlog::debug("rank {} failed mid-response; closing the client connection", rank);
      co_return false;
    }
    if (!client_ok) {
      // The client went away: dropping the engine connection is how vLLM learns to abort the request.
      shared_.metrics.request_finished(rank, 499, duration);
      co_return false;
    }
    if (count_usage && (usage.prompt_tokens() || usage.completion_tokens())) {
      shared_.metrics.tokens(rank, usage.prompt_tokens().value_or(0), usage.completion_tokens().value_or(0));
    }
    shared_.metrics.request_finished(rank, status, duration);
    if (upstream_keep_alive && parser->is_done()) worker_.pool.give_back(rank, std::move(connection));
    co_return keep_client;
  }

  void prepare_upstream_request(client_request& request, const upstream::backend& backend) {
    http::strip_hop_by_hop(request);
    request.erase(bhttp::field::expect);
    request.set(bhttp::field::host, backend.authority);
    http::add_forwarding_headers(request, client_address_);
    request.version(11);
    request.keep_alive(true);
    request.prepare_payload();  // the body was read whole: a chunked request goes on with a Content-Length
  }

  asio::awaitable<bool> fail_before_response(std::size_t rank, clock_type::time_point picked_at,
                                             const boost::system::error_code& ec, std::string_view what,
                                             bool client_keep_alive) {
    const unsigned status = ec == beast::error::timeout ? 504 : 502;
    shared_.metrics.request_finished(rank, status, clock_type::now() - picked_at);
    const auto& backend = shared_.backends[rank];
    spdlog::warn("could not {} rank {} ({}): {}", what, rank, backend.url, ec.message());
    co_return co_await send_error(status,
                                  "dplb could not " + std::string(what) + " backend rank " + std::to_string(rank) +
                                      " (" + backend.url + "): " + ec.message(),
                                  client_keep_alive);
  }

  char* relay_buffer() {
    if (!relay_buffer_) relay_buffer_ = std::make_unique<char[]>(relay_buffer_size);
    return relay_buffer_.get();
  }

  worker_state& worker_;
  shared_state& shared_;
  const config::settings& settings_;
  beast::tcp_stream client_;
  beast::flat_buffer buffer_;
  std::string client_address_;
  std::unique_ptr<char[]> relay_buffer_;
};

}  // namespace

asio::awaitable<void> run_session(worker_state& worker, tcp::socket socket) {
  session s(worker, std::move(socket));
  co_await s.run();
}

}  // namespace dplb::server
