#include "dplb/admin/admin_listener.hpp"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>
#include <spdlog/spdlog.h>

#include <memory>
#include <optional>
#include <string>

#include "dplb/http/error_response.hpp"
#include "dplb/support/supervisor.hpp"

namespace dplb::admin {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
using tcp = asio::ip::tcp;

io::acceptor open_acceptor(const io::executor& executor, const tcp::endpoint& endpoint) {
  io::acceptor acceptor(executor);
  acceptor.open(endpoint.protocol());
  acceptor.set_option(asio::socket_base::reuse_address(true));
  acceptor.bind(endpoint);
  acceptor.listen(asio::socket_base::max_listen_connections);
  return acceptor;
}

namespace {

bhttp::response<bhttp::string_body> to_http(const response& answer, unsigned version, bool keep_alive) {
  bhttp::response<bhttp::string_body> out{static_cast<bhttp::status>(answer.status), version};
  out.set(bhttp::field::content_type, answer.content_type);
  out.set(bhttp::field::cache_control, "no-store");
  // Every answer is what its Content-Type says: a browser must never run JSON as a script or a page.
  out.set("X-Content-Type-Options", "nosniff");
  for (const auto& h : answer.headers) out.insert(h.name, h.value);  // insert: a challenge may come twice
  if (!answer.allow.empty()) out.set(bhttp::field::allow, answer.allow);
  out.body() = answer.body;
  out.keep_alive(keep_alive);
  out.prepare_payload();
  return out;
}

// The request could not be read whole: answered when it says something useful, else closed silently.
std::optional<response> refusal_for(const boost::system::error_code& ec) {
  if (ec == bhttp::error::header_limit) {
    return response{.status = 431, .body = http::error_body(431, "request head too large")};
  }
  if (ec == bhttp::error::body_limit) {
    return response{.status = 413, .body = http::error_body(413, "request body too large")};
  }
  return std::nullopt;
}

io::task<void> serve_connection(const admin_api& api, io::socket socket, listener_limits limits,
                                std::shared_ptr<std::size_t> open) {
  struct count_guard {
    std::shared_ptr<std::size_t> open;
    ~count_guard() { --*open; }
  } guard{std::move(open)};
  boost::system::error_code ec;
  const auto remote = socket.remote_endpoint(ec);
  const std::string peer = ec ? "unknown" : remote.address().to_string();
  io::tcp_stream stream(std::move(socket));
  beast::flat_buffer buffer(limits.max_head_bytes + limits.max_body_bytes);
  for (;;) {
    bhttp::request_parser<bhttp::string_body> parser;
    parser.header_limit(limits.max_head_bytes);
    parser.body_limit(limits.max_body_bytes);
    stream.expires_after(limits.read_timeout);
    auto [read_ec, n] = co_await bhttp::async_read(stream, buffer, parser, io::as_result);
    if (read_ec) {
      if (auto refusal = refusal_for(read_ec)) {
        auto out = to_http(*refusal, 11, false);
        stream.expires_after(limits.write_timeout);
        co_await bhttp::async_write(stream, out, io::as_result);
      }
      break;
    }
    const auto& req = parser.get();
    const auto field = [&req](bhttp::field name) {
      const auto it = req.find(name);
      return it == req.end() ? std::string_view() : std::string_view(it->value());
    };
    const auto answer = api.handle(request{req.method_string(), req.target(), field(bhttp::field::authorization),
                                           req.body(), field(bhttp::field::origin), field(bhttp::field::host)});
    // Neither the header nor the target is logged: one may hold a token, both are the client's bytes.
    if (answer.status == 401) spdlog::warn("admin API: refused a request from {} without a valid token", peer);
    if (answer.status == 403) spdlog::warn("admin API: refused a change from {} asked by another site's page", peer);
    auto out = to_http(answer, req.version(), req.keep_alive());
    stream.expires_after(limits.write_timeout);
    auto [write_ec, written] = co_await bhttp::async_write(stream, out, io::as_result);
    if (write_ec || !out.keep_alive()) break;
  }
  boost::system::error_code ignored;
  stream.socket().shutdown(tcp::socket::shutdown_send, ignored);
}

}  // namespace

io::task<void> accept_loop(const admin_api& api, io::acceptor& acceptor, listener_limits limits) {
  auto executor = co_await asio::this_coro::executor;
  // Only this loop's executor touches the count (one thread), so it needs no atomic.
  auto open = std::make_shared<std::size_t>(0);
  while (acceptor.is_open()) {
    support::fault_point(support::task::admin_accept);
    auto [ec, socket] = co_await acceptor.async_accept(io::as_result);
    if (ec == asio::error::operation_aborted || !acceptor.is_open()) break;
    if (ec) {
      spdlog::warn("admin API: accept failed: {}; retrying in 100 ms", ec.message());
      io::steady_timer pause(executor, std::chrono::milliseconds(100));
      co_await pause.async_wait(io::as_result);
      continue;
    }
    if (*open >= limits.max_connections) {
      spdlog::warn("admin API: {} connections open already; closing a new one", *open);
      continue;  // the socket closes as it goes out of scope
    }
    ++*open;
    asio::co_spawn(executor, serve_connection(api, std::move(socket), limits, open),
                   support::logged_on_failure("an admin API connection"));
  }
}

}  // namespace dplb::admin
