#include "http_client.hpp"

#include "text.hpp"
#include "timing_slack.hpp"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/connect.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdio>
#include <limits>
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
  io_.run_for(scaled(deadline));
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
  io_.run_for(scaled(deadline));
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

namespace {

std::optional<std::size_t> parse_number(std::string_view text, int base) {
  std::size_t value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value, base);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return value;
}

// One response from the start of `bytes`: complete, or as much as is there (complete == false).
raw_response split_one(std::string_view bytes, bool answers_head, bool closed) {
  raw_response r;
  const auto head_end = bytes.find("\r\n\r\n");
  if (head_end == std::string_view::npos) {
    r.raw = std::string(bytes);
    return r;
  }
  r.head = std::string(bytes.substr(0, head_end + 4));
  std::string_view head = r.head;
  const auto status_line = head.substr(0, head.find("\r\n"));
  r.version = std::string(status_line.substr(0, status_line.find(' ')));
  if (status_line.size() >= 12) r.status = parse_number(status_line.substr(9, 3), 10).value_or(0);
  head.remove_prefix(status_line.size() + 2);
  for (std::size_t eol; (eol = head.find("\r\n")) != std::string_view::npos && eol > 0; head.remove_prefix(eol + 2)) {
    const auto line = head.substr(0, eol);
    const auto colon = line.find(':');
    if (colon == std::string_view::npos) continue;
    r.fields.emplace_back(std::string(line.substr(0, colon)), std::string(trim(line.substr(colon + 1))));
  }

  std::size_t at = head_end + 4;
  const auto finish = [&](bool complete) {
    r.complete = complete;
    r.raw = std::string(bytes.substr(0, std::min(at, bytes.size())));
    return r;
  };
  if (r.status / 100 == 1 || r.status == 204 || r.status == 304 || answers_head) return finish(true);
  const auto coding = r.header("transfer-encoding");
  r.chunked = coding && coding->size() >= 7 && iequals(coding->substr(coding->size() - 7), "chunked");
  if (r.chunked) {
    for (;;) {
      const auto eol = bytes.find("\r\n", at);
      if (eol == std::string_view::npos) return finish(false);
      auto size_text = bytes.substr(at, eol - at);
      size_text = trim(size_text.substr(0, size_text.find(';')));
      const auto size = parse_number(size_text, 16);
      if (!size) return finish(false);
      at = eol + 2;
      if (*size == 0) break;
      if (bytes.size() < at + *size + 2) {
        at = bytes.size();
        return finish(false);
      }
      r.body.append(bytes.substr(at, *size));
      at += *size + 2;
    }
    for (;;) {  // trailer lines, then the empty line
      const auto eol = bytes.find("\r\n", at);
      if (eol == std::string_view::npos) return finish(false);
      const bool last = eol == at;
      at = eol + 2;
      if (last) return finish(true);
    }
  }
  if (const auto length = r.header("content-length")) {
    const auto size = parse_number(*length, 10).value_or(0);
    r.body = std::string(bytes.substr(at, size));
    const bool complete = bytes.size() >= at + size;
    at = std::min(bytes.size(), at + size);
    return finish(complete);
  }
  r.close_delimited = true;
  r.body = std::string(bytes.substr(at));
  at = bytes.size();
  return finish(closed);
}

}  // namespace

std::optional<std::string> raw_response::header(std::string_view name) const {
  for (const auto& [n, v] : fields) {
    if (iequals(n, name)) return v;
  }
  return std::nullopt;
}

std::size_t raw_response::header_count(std::string_view name) const {
  return static_cast<std::size_t>(
      std::count_if(fields.begin(), fields.end(), [&](const auto& f) { return iequals(f.first, name); }));
}

raw_split split_responses(std::string_view bytes, const std::vector<bool>& answers_head, bool closed) {
  raw_split out;
  std::size_t finals = 0;
  while (out.consumed < bytes.size()) {
    const auto rest = bytes.substr(out.consumed);
    if (!std::string_view("HTTP/").starts_with(rest.substr(0, 5))) break;  // not a response: left in the bytes
    const bool head = finals < answers_head.size() && answers_head[finals];
    auto response = split_one(rest, head, closed);
    const bool complete = response.complete;
    if (complete && !response.interim()) ++finals;
    if (complete) out.consumed += response.raw.size();
    out.responses.push_back(std::move(response));
    if (!complete) break;
  }
  return out;
}

std::vector<raw_response> raw_reply::final_responses() const {
  std::vector<raw_response> out;
  for (const auto& r : responses) {
    if (r.complete && !r.interim()) out.push_back(r);
  }
  return out;
}

bool raw_reply::has_interim() const {
  return std::any_of(responses.begin(), responses.end(), [](const raw_response& r) { return r.interim(); });
}

raw_reply http_connection::read_responses(std::size_t finals, std::chrono::milliseconds deadline,
                                          const std::vector<bool>& answers_head) {
  raw_reply reply;
  // How many bytes of the pending ones hold the wanted responses; 0 while they are not all there.
  const auto wanted_bytes = [&]() -> std::size_t {
    const auto split = split_responses(raw_pending_, answers_head, false);
    std::size_t seen = 0, bytes = 0;
    for (const auto& r : split.responses) {
      if (!r.complete) break;
      bytes += r.raw.size();
      if (!r.interim() && ++seen == finals) return bytes;
    }
    return 0;
  };
  bool reading = true;
  io_.restart();
  asio::co_spawn(io_, [&]() -> asio::awaitable<void> {
    char chunk[16 * 1024];
    while (finals == 0 || wanted_bytes() == 0) {
      auto [ec, n] = co_await socket_.async_read_some(asio::buffer(chunk), as_result);
      raw_pending_.append(chunk, n);
      if (ec) {
        reply.closed = ec != asio::error::operation_aborted;
        break;
      }
    }
    reading = false;
  }, asio::detached);
  io_.run_for(scaled(deadline));
  if (reading) {
    boost::system::error_code ignored;
    socket_.cancel(ignored);  // stop reading; the connection stays open
    io_.restart();
    io_.run_for(std::chrono::seconds(1));
    reply.deadline_passed = true;
  }
  const std::size_t wanted = finals == 0 ? 0 : wanted_bytes();
  if (wanted > 0) {
    reply.bytes = raw_pending_.substr(0, wanted);
    raw_pending_.erase(0, wanted);
  } else {
    reply.bytes = std::exchange(raw_pending_, std::string());
  }
  reply.responses = split_responses(reply.bytes, answers_head, reply.closed).responses;
  return reply;
}

raw_reply http_connection::read_to_close(std::chrono::milliseconds deadline) {
  return read_responses(0, deadline);
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
