#include "dplb/upstream/http_fetch.hpp"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http.hpp>

namespace dplb::upstream {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;

namespace {

// One request and its answer on a fresh connection, on the calling coroutine's executor type (the side
// channels run on any_io_executor, the proxy's workers on their io_context's own).
template <class Executor>
asio::awaitable<std::optional<fetched>, Executor> exchange(const backend& target, bhttp::verb method,
                                                           std::string_view path, std::string_view json_body,
                                                           std::string_view user_agent, std::chrono::milliseconds timeout,
                                                           std::size_t body_limit) {
  constexpr auto as_result = asio::as_tuple(asio::use_awaitable_t<Executor>{});
  beast::basic_stream<asio::ip::tcp, Executor> stream(co_await asio::this_coro::executor);
  stream.expires_after(timeout);  // one deadline for the whole exchange
  auto [cec, endpoint] = co_await stream.async_connect(target.endpoints, as_result);
  if (cec) co_return std::nullopt;
  bhttp::request<bhttp::string_body> request{method, path, 11};
  request.set(bhttp::field::host, target.authority);
  request.set(bhttp::field::user_agent, user_agent);
  if (method == bhttp::verb::post) {
    request.set(bhttp::field::content_type, "application/json");
    request.body() = json_body;
    request.prepare_payload();
  }
  request.keep_alive(false);
  auto [wec, written] = co_await bhttp::async_write(stream, request, as_result);
  if (wec) co_return std::nullopt;
  beast::flat_buffer buffer;
  bhttp::response_parser<bhttp::string_body> parser;
  parser.body_limit(body_limit);
  auto [rec, read] = co_await bhttp::async_read(stream, buffer, parser, as_result);
  if (rec) co_return std::nullopt;
  boost::system::error_code ignored;
  stream.socket().shutdown(asio::ip::tcp::socket::shutdown_both, ignored);
  co_return fetched{parser.get().result_int(), std::move(parser.get().body())};
}

}  // namespace

asio::awaitable<std::optional<fetched>> fetch(const backend& target, std::string_view path,
                                              std::string_view user_agent, std::chrono::milliseconds timeout,
                                              std::size_t body_limit) {
  return exchange<asio::any_io_executor>(target, bhttp::verb::get, path, {}, user_agent, timeout, body_limit);
}

io::task<std::optional<fetched>> post_json(const backend& target, std::string_view path, std::string_view body,
                                           std::string_view user_agent, std::chrono::milliseconds timeout,
                                           std::size_t body_limit) {
  return exchange<io::executor>(target, bhttp::verb::post, path, body, user_agent, timeout, body_limit);
}

}  // namespace dplb::upstream
