#include "http_client.hpp"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/connect.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <cstdio>
#include <sstream>
#include <stdexcept>

namespace dplb::test {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
constexpr auto as_result = asio::as_tuple(asio::use_awaitable);

http_connection::http_connection(std::uint16_t port, std::chrono::milliseconds deadline)
    : socket_(io_), port_(port) {
  boost::system::error_code result = asio::error::timed_out;
  socket_.async_connect(tcp::endpoint(asio::ip::make_address("127.0.0.1"), port),
                        [&](const boost::system::error_code& ec) { result = ec; });
  io_.run_for(deadline);
  if (result) throw std::runtime_error("cannot connect to 127.0.0.1:" + std::to_string(port) + ": " + result.message());
  socket_.set_option(tcp::no_delay(true));
}

http_connection::~http_connection() { close(); }

void http_connection::close() {
  boost::system::error_code ignored;
  socket_.close(ignored);
}

bool http_connection::is_open() const { return socket_.is_open(); }

template <class Op>
void http_connection::run_bounded(Op&& op, std::chrono::milliseconds deadline, http_response* response) {
  bool done = false;
  io_.restart();
  asio::co_spawn(io_, [&]() -> asio::awaitable<void> {
    co_await op();
    done = true;
  }, asio::detached);
  io_.run_for(deadline);
  if (!done) {
    close();  // cancels the operation; its completion runs below
    io_.restart();
    io_.run_for(std::chrono::seconds(1));
    if (response && response->error.empty()) response->error = "deadline exceeded";
  }
}

namespace {

void complete_request(bhttp::request<bhttp::string_body>& request, std::uint16_t port) {
  if (request.find(bhttp::field::host) == request.end()) request.set(bhttp::field::host, "127.0.0.1:" + std::to_string(port));
  if (request.version() == 0) request.version(11);
  if (request.find(bhttp::field::transfer_encoding) == request.end()) request.prepare_payload();
}

}  // namespace

http_response http_connection::send(bhttp::request<bhttp::string_body> request, std::chrono::milliseconds deadline) {
  complete_request(request, port_);
  http_response response;
  boost::beast::flat_buffer storage;
  run_bounded([&]() -> asio::awaitable<void> {
    auto [wec, wn] = co_await bhttp::async_write(socket_, request, as_result);
    if (wec) { response.error = "write: " + wec.message(); co_return; }
    bhttp::response_parser<bhttp::string_body> parser;
    parser.body_limit(boost::none);
    if (request.method() == bhttp::verb::head) parser.skip(true);
    auto [rec, rn] = co_await bhttp::async_read(socket_, storage, parser, as_result);
    response.status = parser.get().result_int();
    response.headers = parser.get().base();
    response.body = std::move(parser.get().body());
    response.keep_alive = parser.get().keep_alive();
    response.complete = !rec && parser.is_done();
    if (rec) response.error = "read: " + rec.message();
  }, deadline, &response);
  return response;
}

http_response http_connection::send_streaming(bhttp::request<bhttp::string_body> request,
                                              std::chrono::milliseconds deadline) {
  complete_request(request, port_);
  http_response response;
  boost::beast::flat_buffer storage;
  run_bounded([&]() -> asio::awaitable<void> {
    auto [wec, wn] = co_await bhttp::async_write(socket_, request, as_result);
    if (wec) { response.error = "write: " + wec.message(); co_return; }
    bhttp::response_parser<bhttp::buffer_body> parser;
    parser.body_limit(boost::none);
    auto [hec, hn] = co_await bhttp::async_read_header(socket_, storage, parser, as_result);
    if (hec) { response.error = "read head: " + hec.message(); co_return; }
    response.head_at = steady::now();
    response.status = parser.get().result_int();
    response.headers = parser.get().base();
    response.keep_alive = parser.get().keep_alive();
    char piece[64 * 1024];
    while (!parser.is_done()) {
      parser.get().body().data = piece;
      parser.get().body().size = sizeof piece;
      auto [ec, n] = co_await bhttp::async_read_some(socket_, storage, parser, as_result);
      if (ec && ec != bhttp::error::need_buffer) { response.error = "read body: " + ec.message(); co_return; }
      const std::size_t got = sizeof piece - parser.get().body().size;
      if (got == 0) continue;
      response.pieces.emplace_back(steady::now(), std::string(piece, got));
      response.body.append(piece, got);
    }
    response.complete = true;
  }, deadline, &response);
  return response;
}

void http_connection::write_raw(std::string_view bytes) {
  boost::system::error_code ec;
  asio::write(socket_, asio::buffer(bytes.data(), bytes.size()), ec);
  if (ec) throw std::runtime_error("write_raw: " + ec.message());
}

std::string http_connection::read_until_close(std::chrono::milliseconds deadline) {
  std::string all;
  run_bounded([&]() -> asio::awaitable<void> {
    char chunk[16 * 1024];
    for (;;) {
      auto [ec, n] = co_await socket_.async_read_some(asio::buffer(chunk), as_result);
      all.append(chunk, n);
      if (ec) co_return;
    }
  }, deadline, nullptr);
  return all;
}

std::size_t http_connection::read_for(std::chrono::milliseconds duration) {
  std::size_t total = 0;
  bool reading = true;
  io_.restart();
  asio::co_spawn(io_, [&]() -> asio::awaitable<void> {
    char chunk[64 * 1024];
    for (;;) {
      auto [ec, n] = co_await socket_.async_read_some(asio::buffer(chunk), as_result);
      total += n;
      if (ec) break;
    }
    reading = false;
  }, asio::detached);
  io_.run_for(duration);
  if (reading) {
    boost::system::error_code ignored;
    socket_.cancel(ignored);  // stop reading; the connection stays open
    io_.restart();
    io_.run_for(std::chrono::seconds(1));
  }
  return total;
}

http_response http_get(std::uint16_t port, const std::string& target, std::chrono::milliseconds deadline) {
  http_connection c(port);
  return c.send({bhttp::verb::get, target, 11}, deadline);
}

http_response http_post_json(std::uint16_t port, const std::string& target, const std::string& json,
                             std::chrono::milliseconds deadline) {
  http_connection c(port);
  bhttp::request<bhttp::string_body> request{bhttp::verb::post, target, 11};
  request.set(bhttp::field::content_type, "application/json");
  request.body() = json;
  return c.send(std::move(request), deadline);
}

std::map<std::string, double> parse_metrics(const std::string& text) {
  std::map<std::string, double> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    const auto space = line.rfind(' ');
    if (space == std::string::npos) continue;
    try {
      out[line.substr(0, space)] = std::stod(line.substr(space + 1));
    } catch (const std::exception&) {
      // NaN/Inf spellings we do not need; skip the line.
    }
  }
  return out;
}

std::map<std::string, double> scrape_metrics(std::uint16_t port) {
  auto response = http_get(port, "/metrics");
  if (response.status != 200) throw std::runtime_error("GET /metrics on port " + std::to_string(port) + " failed: " + response.error);
  return parse_metrics(response.body);
}

std::string fnv1a64_hex(std::string_view bytes) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : bytes) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  char out[17];
  std::snprintf(out, sizeof out, "%016llx", static_cast<unsigned long long>(h));
  return out;
}

}  // namespace dplb::test
