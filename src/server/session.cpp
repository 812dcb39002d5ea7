#include "dplb/server/session.hpp"

#include <boost/asio/buffer.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>
#include <boost/url/parse.hpp>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <memory>
#include <optional>
#include <utility>

#include "dplb/http/error_response.hpp"
#include "dplb/http/header_sanitizer.hpp"
#include "dplb/http/wire_format.hpp"
#include "dplb/metrics/usage_scanner.hpp"

namespace dplb::server {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
using tcp = asio::ip::tcp;
using clock_type = std::chrono::steady_clock;

namespace {

using io::as_result;

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

// Shared between a proxied request and the coroutine that watches its client for a disconnect.
struct client_watch {
  bool done = false;                                  // the request is over; the watcher must not touch anything
  bool client_gone = false;                           // the client closed or reset its connection
  upstream::upstream_connection* upstream = nullptr;  // closed by the watcher when the client goes
  char probe = 0;  // where the watch's MSG_PEEK copies a byte (never read; nothing is consumed)
};

// Watches the client's socket while its request is proxied. Bytes arriving there are a pipelined next
// request (left in the socket for the session to read); end-of-file or an error is the client leaving,
// and the engine connection is closed at once so the engine aborts the request and frees its KV cache.
//
// The watch is a one-byte MSG_PEEK receive with a plain completion handler: Asio arms an async_wait with
// an epoll_ctl call every time, while a receive on a socket already registered for input costs no system
// call until the socket becomes readable; and a handler costs less than a coroutine per request.
void watch_client(io::socket& socket, std::shared_ptr<client_watch> watch) {
  auto* probe = &watch->probe;
  socket.async_receive(asio::buffer(probe, 1), io::socket::message_peek,
                       [watch = std::move(watch)](const boost::system::error_code& ec, std::size_t n) {
                         // `done` first: the session and its sockets may be gone.
                         if (watch->done || ec == asio::error::operation_aborted) return;
                         if (!ec && n > 0) return;  // a pipelined request: not a disconnect
                         watch->client_gone = true;  // end of file or an error: the client left
                         if (watch->upstream) {
                           boost::system::error_code ignored;
                           watch->upstream->stream.socket().close(ignored);
                         }
                       });
}

// The relay's deadlines, without a timer operation per read and per write. A stream is relayed with one
// read and one write per event, and beast::tcp_stream arms and cancels a timer around each of them (a
// timer-queue insertion and removal and a wrapped handler, every time). Here an operation only stores
// its deadline; one timer per relay wakes at the earliest deadline (or every `period` while none is set)
// and closes the socket whose deadline has passed, so that its pending operation fails, as it would
// with tcp_stream's own timeout. `period` is the shorter of the two timeouts, so no deadline is noticed
// more than one period late.
class relay_watchdog : public std::enable_shared_from_this<relay_watchdog> {
 public:
  using time_point = clock_type::time_point;

  relay_watchdog(const io::executor& executor, io::socket& upstream, io::socket& client,
                 std::chrono::milliseconds period)
      : timer_(executor), upstream_(upstream), client_(client), period_(period) {}

  void start() { arm(clock_type::now() + period_); }
  void stop() {
    stopped_ = true;
    timer_.cancel();
  }

  void reading(std::chrono::milliseconds timeout) { upstream_deadline_ = clock_type::now() + timeout; }
  void writing(std::chrono::milliseconds timeout) { client_deadline_ = clock_type::now() + timeout; }
  void idle() { upstream_deadline_ = client_deadline_ = time_point::max(); }

 private:
  void arm(time_point at) {
    timer_.expires_at(at);
    timer_.async_wait([self = shared_from_this()](const boost::system::error_code& ec) { self->expired(ec); });
  }

  void expired(const boost::system::error_code& ec) {
    if (ec || stopped_) return;  // stopped: the sockets may be gone
    const auto now = clock_type::now();
    boost::system::error_code ignored;
    if (now >= upstream_deadline_) {  // the engine fell silent
      upstream_.close(ignored);
      upstream_deadline_ = time_point::max();
    }
    if (now >= client_deadline_) {  // the client stopped reading
      client_.close(ignored);
      client_deadline_ = time_point::max();
    }
    // Never sleep past `period`: a deadline stored after this wake-up (now + a timeout >= period) is then
    // checked in time, however far the other deadline is. And keep watching after a close: the operation
    // it was meant for may have completed just before, and the relay may go on to another one.
    arm(std::min(std::min(upstream_deadline_, client_deadline_), now + period_));
  }

  io::steady_timer timer_;
  io::socket& upstream_;
  io::socket& client_;
  std::chrono::milliseconds period_;
  time_point upstream_deadline_ = time_point::max();
  time_point client_deadline_ = time_point::max();
  bool stopped_ = false;
};

class session {
 public:
  session(worker_state& worker, io::socket socket)
      : worker_(worker), shared_(worker.shared), settings_(worker.shared.settings), client_(std::move(socket)),
        buffer_(settings_.max_header_bytes + 64 * 1024) {
    boost::system::error_code ec;
    auto remote = client_.socket().remote_endpoint(ec);
    client_address_ = ec ? "unknown" : remote.address().to_string();
    client_.socket().set_option(tcp::no_delay(true), ec);
  }

  io::task<void> run() {
    shared_.metrics.client_connection_opened();
    struct closed_on_exit {
      shared_state& shared;
      ~closed_on_exit() {
        shared.metrics.client_connection_closed();
        shared.client_connections.fetch_sub(1, std::memory_order_relaxed);
      }
    } count_guard{shared_};

    // A drain lets the request in progress finish, then closes (the response says Connection: close).
    try {
      while (co_await serve_one_request() && !shared_.draining.load(std::memory_order_relaxed)) {
      }
    } catch (const std::exception& e) {
      // Errors on the request path are values; an exception here is a bug, and costs only this connection.
      spdlog::error("closing a client connection after an unexpected error: {}", e.what());
    }
    boost::system::error_code ec;
    client_.socket().shutdown(tcp::socket::shutdown_send, ec);
    client_.socket().close(ec);
  }

 private:
  // Reads and answers one request. Returns whether the connection stays open for another.
  io::task<bool> serve_one_request() {
    bhttp::request_parser<bhttp::string_body> parser;
    parser.header_limit(static_cast<std::uint32_t>(settings_.max_header_bytes));
    parser.body_limit(settings_.max_request_body_bytes);

    client_.expires_after(settings_.client_idle_timeout);
    worker_.idle_clients.insert(&client_);
    auto head_ec = co_await read_raw_head();
    worker_.idle_clients.erase(&client_);
    if (head_ec == bhttp::error::bad_field) {
      co_return co_await reject(400, "obsolete line folding in a header is not accepted (RFC 9112 5.2)", false);
    }
    if (head_ec) co_return co_await refuse_unreadable_request(head_ec, buffer_.size() > 0);
    // The whole head is in the buffer now: this parses it without any I/O.
    auto [ec, unused] = co_await bhttp::async_read_header(client_, buffer_, parser, as_result);
    if (ec) co_return co_await refuse_unreadable_request(ec, true);

    auto& request = parser.get();
    if (auto problem = http::check_request_framing(request)) {
      // The body's end cannot be known: answer and close, never guess.
      co_return co_await reject(problem->status, problem->message, false);
    }
    if (request.version() < 11 && request.count(bhttp::field::transfer_encoding) > 0) {
      co_return co_await reject(400, "Transfer-Encoding is not allowed in an HTTP/1.0 request", false);
    }
    if (request.method() == bhttp::verb::connect || request.method() == bhttp::verb::trace) {
      // dplb is no forward proxy (CONNECT), and TRACE only reflects headers back (cross-site tracing).
      co_return co_await reject(405, "method not allowed through dplb", false);
    }
    if (!to_origin_form(request)) {
      co_return co_await reject(400, "request target must be a path (origin-form) or an absolute http URL", false);
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

    const bool keep_alive = request.keep_alive() && !shared_.draining.load(std::memory_order_relaxed);
    const auto path = path_of(request.target());
    if (path == "/metrics" || path == "/health") co_return co_await serve_own_path(request, path, keep_alive);
    co_return co_await proxy(request, keep_alive);
  }

  // Reads until the buffer holds a complete request head (bounded by --max-header-bytes, under the
  // deadline already set), so that it can be checked as raw bytes before Beast parses it: Beast
  // silently unfolds obs-fold, which RFC 9112 lets a proxy do only by rejecting or rewriting, and a
  // folded header is a classic way to make two parsers disagree. bad_field reports a fold.
  io::task<boost::system::error_code> read_raw_head() {
    std::size_t searched = 0;  // bytes already known to hold no end of head
    for (;;) {
      const auto head = http::find_head_end(
          {static_cast<const char*>(buffer_.data().data()), buffer_.size()}, searched);
      if (head.complete) co_return head.folded ? bhttp::error::bad_field : boost::system::error_code{};
      searched = head.searched;
      if (buffer_.size() >= settings_.max_header_bytes) co_return bhttp::error::header_limit;
      auto [ec, n] = co_await client_.async_read_some(buffer_.prepare(16 * 1024), as_result);
      buffer_.commit(n);
      if (ec) co_return ec == asio::error::eof && buffer_.size() == 0 ? bhttp::error::end_of_stream : ec;
    }
  }

  // An absolute-form target (GET http://host/path) is rewritten to its path: the authority in it is never
  // where the request goes (only configured backends are), and dplb's own paths are recognised in it.
  static bool to_origin_form(client_request& request) {
    const auto target = request.target();
    if (!target.empty() && target.front() == '/') return true;
    if (target == "*") return request.method() == bhttp::verb::options;
    auto url = boost::urls::parse_absolute_uri(target);
    if (!url || (url->scheme_id() != boost::urls::scheme::http && url->scheme_id() != boost::urls::scheme::https)) {
      return false;
    }
    std::string origin(url->encoded_path().empty() ? "/" : std::string_view(url->encoded_path()));
    if (url->has_query()) {
      origin += '?';
      origin += url->encoded_query();
    }
    request.target(origin);
    return true;
  }

  io::task<bool> refuse_unreadable_request(const boost::system::error_code& ec, bool got_some) {
    if (ec == bhttp::error::header_limit) {
      co_return co_await reject(431, "request head exceeds the limit (--max-header-bytes)", false);
    }
    if (ec == bhttp::error::body_limit) {
      co_return co_await reject(413, "request body exceeds the limit (--max-request-body-bytes)", false);
    }
    if (ec == beast::error::timeout && got_some) {
      // A request started but not finished in time (slowloris). The stream's deadline has closed the
      // socket already, so, as nginx does, the 408 is only counted, never sent.
      shared_.metrics.rejected(408);
      co_return false;
    }
    if (ec.category() == bhttp::make_error_code(bhttp::error::bad_version).category() &&
        ec != bhttp::error::end_of_stream && ec != bhttp::error::partial_message) {
      co_return co_await reject(400, "malformed HTTP request: " + ec.message(), false);
    }
    co_return false;  // the client went away or stayed idle: close quietly
  }

  io::task<bool> reject(unsigned status, std::string_view message, bool keep_alive) {
    shared_.metrics.rejected(status);
    co_return co_await send_error(status, message, keep_alive);
  }

  io::task<bool> send_error(unsigned status, std::string_view message, bool keep_alive,
                                   bool retry_later = false) {
    bhttp::response<bhttp::string_body> response{static_cast<bhttp::status>(status), 11};
    response.set(bhttp::field::content_type, "application/json");
    if (retry_later) response.set(bhttp::field::retry_after, "1");
    response.body() = http::error_body(status, message);
    co_return co_await send_local(response, keep_alive, false);
  }

  io::task<bool> send_local(bhttp::response<bhttp::string_body>& response, bool keep_alive,
                                   bool head_request) {
    response.keep_alive(keep_alive);
    response.prepare_payload();
    if (head_request) response.body().clear();  // Content-Length still tells the size of a GET
    client_.expires_after(settings_.client_write_timeout);
    auto [ec, n] = co_await bhttp::async_write(client_, response, as_result);
    co_return !ec && keep_alive;
  }

  io::task<bool> serve_own_path(const client_request& request, std::string_view path, bool keep_alive) {
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
    } else if (shared_.draining.load(std::memory_order_relaxed)) {
      response.result(bhttp::status::service_unavailable);
      response.set(bhttp::field::content_type, "application/json");
      response.body() = http::error_body(503, "dplb is shutting down");
    } else if (!shared_.balancer.any_usable()) {
      response.result(bhttp::status::service_unavailable);
      response.set(bhttp::field::content_type, "application/json");
      response.set(bhttp::field::retry_after, "1");
      response.body() = http::error_body(503, "no backend rank is usable");
    }
    co_return co_await send_local(response, keep_alive, head_request);
  }

  enum class slot_refusal { none, no_usable_rank, queue_full, queue_timeout, client_gone };
  struct slot_result {
    balancer::rank_lease lease;
    slot_refusal refusal = slot_refusal::none;
  };

  // A slot on a rank: at once, or (with --max-inflight-per-rank) after a FIFO wait in dplb's queue,
  // bounded by --queue-timeout-ms.
  io::task<slot_result> acquire_slot() {
    if (!shared_.balancer.queueing()) {
      auto lease = shared_.balancer.acquire();
      co_return slot_result{std::move(lease), slot_refusal::no_usable_rank};
    }
    struct wait_state {
      explicit wait_state(const io::executor& ex) : timer(ex) {}
      io::steady_timer timer;
      balancer::rank_lease lease;
      bool gave_up = false;
      bool waking = false;       // the wait is over: the client watch must not touch it any more
      bool client_gone = false;  // the client closed or reset its connection while queued
      char probe = 0;            // where the watch's MSG_PEEK copies a byte (nothing is consumed)
    };
    auto executor = client_.get_executor();
    auto state = std::make_shared<wait_state>(executor);
    std::uint64_t waiter_id = 0;
    bool queued = false;
    // Runs on whichever thread freed the slot: it only hands the lease to this session's thread.
    auto deliver = [state, executor](balancer::rank_lease lease) {
      asio::post(executor, [state, lease = std::move(lease)]() mutable {
        if (state->gave_up) return;  // too late: the lease is released right here
        state->lease = std::move(lease);
        state->timer.cancel();
      });
    };
    auto lease = shared_.balancer.acquire_or_wait(deliver, waiter_id, queued);
    if (lease) co_return slot_result{std::move(lease)};
    if (!queued) {
      co_return slot_result{{}, shared_.balancer.any_usable() ? slot_refusal::queue_full : slot_refusal::no_usable_rank};
    }
    const auto waiting_since = clock_type::now();
    state->timer.expires_after(settings_.queue_timeout);
    // A client that leaves while queued must give its place up at once: otherwise it holds up everyone
    // behind it and, once served, its request still reaches an engine. The watch is watch_client's
    // one-byte MSG_PEEK (see there); bytes arriving are a pipelined request, not a departure.
    client_.socket().async_receive(asio::buffer(&state->probe, 1), io::socket::message_peek,
                                   [state](const boost::system::error_code& ec, std::size_t n) {
                                     if (state->waking || ec == asio::error::operation_aborted) return;
                                     if (!ec && n > 0) return;
                                     state->client_gone = true;
                                     state->timer.cancel();
                                   });
    co_await state->timer.async_wait(as_result);
    state->waking = true;
    boost::system::error_code ignored;
    client_.socket().cancel(ignored);  // ends the watch; nothing else is pending on the client socket
    shared_.metrics.queued(clock_type::now() - waiting_since);
    if (state->lease && !state->client_gone) co_return slot_result{std::move(state->lease)};
    state->gave_up = true;
    shared_.balancer.cancel_wait(waiter_id);  // if it was served meanwhile, the posted lease is released
    state->lease.release();                   // served, but the client has left: the slot goes on
    co_return slot_result{{}, state->client_gone ? slot_refusal::client_gone : slot_refusal::queue_timeout};
  }

  // Picks a rank, sends it the request and relays the response. Returns whether the client
  // connection may carry another request.
  io::task<bool> proxy(client_request& request, bool client_keep_alive) {
    const bool client_understands_chunked = request.version() >= 11;  // before the head is rewritten
    if (!prepare_upstream_request(request)) {
      co_return co_await reject(431, "X-Forwarded-For or Via is too long to append to", false);
    }
    auto slot = co_await acquire_slot();
    auto lease = std::move(slot.lease);
    if (slot.refusal == slot_refusal::client_gone) {
      // Counted as nginx counts a client that closes first (499), among the rejected: it never had a
      // rank to be counted on in dplb_requests_total. Nobody is left to answer.
      shared_.metrics.rejected(499);
      co_return false;
    }
    if (!lease) {
      const unsigned status = slot.refusal == slot_refusal::queue_full ? 429 : 503;
      shared_.metrics.rejected(status);
      const char* why = slot.refusal == slot_refusal::queue_full
                            ? "every rank is at --max-inflight-per-rank and dplb's queue is full; retry later"
                        : slot.refusal == slot_refusal::queue_timeout
                            ? "no rank slot freed within --queue-timeout-ms; retry later"
                            : "no backend rank is usable; check the engines and their /health";
      co_return co_await send_error(status, why, client_keep_alive, true);
    }
    auto picked_at = clock_type::now();
    const bool head_request = request.method() == bhttp::verb::head;

    // While dplb waits for the engine and relays its answer, a watcher notices the client leaving and
    // closes the engine connection at once: that is how vLLM learns to abort the request.
    auto watch = std::make_shared<client_watch>();
    watch_client(client_.socket(), watch);
    struct stop_watch_on_exit {
      client_watch& w;
      io::socket& socket;
      ~stop_watch_on_exit() {
        w.done = true;
        w.upstream = nullptr;
        boost::system::error_code ignored;
        socket.cancel(ignored);
      }
    } stop_watch{*watch, client_.socket()};

    upstream::connection_ptr connection;
    std::optional<bhttp::response_parser<bhttp::buffer_body>> parser;
    std::vector<bool> tried(shared_.backends.size(), false);
    for (std::size_t retries = 0;; ++retries) {
      const auto attempt = co_await exchange_head(lease.rank(), request, head_request, *watch, connection, parser);
      if (!attempt.ec) break;
      if (watch->client_gone) {
        shared_.metrics.request_finished(lease.rank(), 499, clock_type::now() - picked_at);
        co_return false;
      }
      shared_.metrics.upstream_error(lease.rank(), attempt.kind);
      shared_.health.record(lease.rank(), attempt.outcome);
      if (attempt.retry_elsewhere && retries < settings_.max_retries) {
        // Nothing reached the engine's application and nothing reached the client: try another rank.
        tried[lease.rank()] = true;
        if (auto next = shared_.balancer.acquire(tried)) {
          spdlog::debug("rank {} failed ({}); retrying on rank {}", lease.rank(), attempt.ec.message(), next.rank());
          shared_.metrics.retried();
          lease = std::move(next);
          picked_at = clock_type::now();
          continue;
        }
      }
      const auto failed_rank = lease.rank();
      lease.release();  // before the answer: a client that saw the 502 also sees the slot free
      co_return co_await fail_before_response(failed_rank, picked_at, attempt.ec, attempt.kind, client_keep_alive);
    }
    const std::size_t rank = lease.rank();
    shared_.metrics.first_byte(rank, clock_type::now() - picked_at);

    // The response head for the client: the engine's, minus hop-by-hop headers, with dplb's own framing.
    auto& upstream_head = parser->get();
    const unsigned status = upstream_head.result_int();
    if (status >= 500) {
      // Relayed as it is (the engine's message is the useful one), but it counts against the rank.
      shared_.metrics.upstream_error(rank, "server_error");
      shared_.health.record(rank, upstream::request_outcome::server_error);
    } else {
      shared_.health.record(rank, upstream::request_outcome::success);
    }
    const bool upstream_keep_alive = upstream_head.keep_alive();
    const bool has_body = response_has_body(status, head_request);
    // Rewritten in place, without copying a field: the parser keeps its own record of the engine's
    // framing and keep-alive, so the fields are free to become the client's head.
    auto& out = upstream_head;
    out.version(11);
    http::strip_hop_by_hop(out);
    bool keep_client = client_keep_alive;
    bool chunked_out = false;
    if (has_body && !parser->content_length()) {
      // Chunked, or delimited by the engine closing: relay as chunked to an HTTP/1.1 client; an
      // HTTP/1.0 client gets the body delimited by dplb closing the connection.
      if (client_understands_chunked) {
        out.chunked(true);
        chunked_out = true;
      } else {
        keep_client = false;
      }
    }
    out.set("x-dplb-rank", std::to_string(rank));
    out.keep_alive(keep_client);

    // What goes to the client is laid out by hand (http/wire_format.hpp): the head, then the body bytes
    // exactly as the engine's framing delivered them, re-framed as chunks when relayed chunked. Each
    // write gathers the head (the first time), the chunk framing and the data into one system call.
    std::string& framing = client_framing_;
    framing.clear();
    http::append_response_head(framing, out.base());
    bool head_sent = false;
    bool body_ended = false;  // the terminating chunk (if any) has been sent
    // Sends body bytes (none for the head alone), with the head before them the first time; `last`
    // ends the body (the terminating chunk when chunked).
    // The relay's reads and writes go straight to the sockets, their deadlines kept by one watchdog.
    const auto watchdog = std::make_shared<relay_watchdog>(
        client_.get_executor(), connection->stream.socket(), client_.socket(),
        std::min(settings_.upstream_read_timeout, settings_.client_write_timeout));
    watchdog->start();
    struct stop_watchdog_on_exit {
      relay_watchdog& w;
      ~stop_watchdog_on_exit() { w.stop(); }
    } stop_watchdog{*watchdog};
    const auto send = [&](std::string_view data, bool last) -> io::task<bool> {
      if (head_sent) framing.clear();
      std::string_view tail;
      if (chunked_out) {
        if (!data.empty()) http::append_chunk_header(framing, data.size());
        static constexpr std::string_view end_and_last = "\r\n0\r\n\r\n";
        tail = data.empty() ? (last ? http::last_chunk : std::string_view{}) : (last ? end_and_last : http::chunk_end);
      }
      const std::array<asio::const_buffer, 3> pieces{asio::buffer(framing), asio::buffer(data), asio::buffer(tail)};
      watchdog->writing(settings_.client_write_timeout);
      auto [ec, n] = co_await asio::async_write(client_.socket(), pieces, as_result);
      watchdog->idle();
      head_sent = true;
      body_ended = last;
      co_return !ec;
    };

    metrics::usage_scanner usage;
    const bool count_usage = status == 200;
    bool upstream_ok = true;
    bool client_ok = true;

    // Once the engine has sent everything, the request is accounted for at once: its slot is given back
    // (from then on it costs the engine nothing) and it is counted, so a client that has seen the end of
    // its response also sees the metrics that include it.
    bool accounted = false;
    const auto engine_finished = [&] {
      if (std::exchange(accounted, true)) return;
      lease.release();
      if (count_usage && (usage.prompt_tokens() || usage.completion_tokens())) {
        shared_.metrics.tokens(rank, usage.prompt_tokens().value_or(0), usage.completion_tokens().value_or(0));
      }
      shared_.metrics.request_finished(rank, status, clock_type::now() - picked_at);
    };
    if (!has_body || parser->is_done()) {
      // No body to relay (HEAD, 204, 304, Content-Length: 0): accounted for now, then the head alone.
      engine_finished();
      client_ok = co_await send({}, true);
    } else if (connection->buffer.size() == 0) {
      // Nothing of the body is here yet (a stream waiting for its first token): the head goes now so the
      // client sees the status at once. Otherwise it leaves together with the first body bytes.
      client_ok = co_await send({}, false);
    }
    char* relay = relay_buffer();
    while (client_ok && has_body && !parser->is_done()) {
      parser->get().body().data = relay;
      parser->get().body().size = relay_buffer_size;
      watchdog->reading(settings_.upstream_read_timeout);
      auto [read_ec, read] =
          co_await bhttp::async_read_some(connection->stream.socket(), connection->buffer, *parser, as_result);
      watchdog->idle();
      if (read_ec && read_ec != bhttp::error::need_buffer) {
        upstream_ok = false;
        break;
      }
      const std::size_t got = relay_buffer_size - parser->get().body().size;
      if (count_usage) usage.feed({relay, got});
      if (parser->is_done()) engine_finished();
      if (got == 0 && !parser->is_done()) continue;  // a chunk header without data yet
      client_ok = co_await send({relay, got}, parser->is_done());
    }
    if (client_ok && upstream_ok && !body_ended) {
      // A safety net: the loop above sends the end itself (a read that completes the body is always sent
      // with `last`, even when it delivered no data), so a client is never left without the body's end.
      client_ok = co_await send({}, true);
    }

    const auto duration = clock_type::now() - picked_at;
    if (watch->client_gone || !client_ok) {
      // The client went away: dropping the engine connection is how vLLM learns to abort the request.
      // (If the engine had already finished, the request was counted with its status.)
      if (!accounted) shared_.metrics.request_finished(rank, 499, duration);
      co_return false;
    }
    if (!upstream_ok && !head_sent) {
      // The engine failed before anything reached the client (the head was held back to leave with the
      // first body bytes): the client can still get a proper error.
      shared_.metrics.upstream_error(rank, "midstream");
      shared_.health.record(rank, upstream::request_outcome::reset);
      lease.release();
      co_return co_await fail_before_response(rank, picked_at, asio::error::connection_reset, "midstream",
                                              client_keep_alive);
    }
    if (!upstream_ok) {
      // Part of the response is already out: closing without the terminating chunk (or short of the
      // Content-Length) is the only way left to tell the client the response is incomplete.
      shared_.metrics.upstream_error(rank, "midstream");
      shared_.health.record(rank, upstream::request_outcome::reset);
      shared_.metrics.request_finished(rank, status, duration);
      spdlog::warn("rank {} ({}) failed mid-response; the client sees a truncated response", rank,
                   shared_.backends[rank].url);
      co_return false;
    }
    // (A watchdog that fired at the very moment the last read completed has closed the socket: not reusable.)
    if (upstream_keep_alive && parser->is_done() && connection->stream.socket().is_open()) {
      worker_.pool.give_back(rank, std::move(connection));
    }
    co_return keep_client;
  }

  bool prepare_upstream_request(client_request& request) {
    http::strip_hop_by_hop(request);
    request.erase(bhttp::field::expect);
    if (!http::add_forwarding_headers(request, client_address_)) return false;
    request.version(11);
    request.keep_alive(true);
    request.prepare_payload();  // the body was read whole: a chunked request goes on with a Content-Length
    return true;
  }

  struct head_attempt {
    boost::system::error_code ec;                  // empty: the response head is in the parser
    std::string_view kind;                         // for dplb_upstream_errors_total
    upstream::request_outcome outcome = upstream::request_outcome::success;
    bool retry_elsewhere = false;                  // safe to send to another rank
  };

  // Sends the request to the rank and reads the response head. A pooled connection that turns out
  // closed before any response byte is the keep-alive race (the engine closed it while idle): the
  // request is re-sent on a fresh connection to the same rank, invisibly.
  io::task<head_attempt> exchange_head(std::size_t rank, client_request& request, bool head_request,
                                              client_watch& watch, upstream::connection_ptr& connection,
                                              std::optional<bhttp::response_parser<bhttp::buffer_body>>& parser) {
    request.set(bhttp::field::host, shared_.backends[rank].authority);
    const auto head_timeout = settings_.upstream_first_byte_timeout.count() > 0 ? settings_.upstream_first_byte_timeout
                                                                                : settings_.upstream_read_timeout;
    for (int attempt = 0;; ++attempt) {
      watch.upstream = nullptr;  // the watcher must never see a connection that is about to be destroyed
      // A re-send always takes a fresh connection: the engine may have dropped every pooled one (restart).
      connection = attempt == 0 ? worker_.pool.take_idle(rank) : nullptr;
      if (!connection) {
        auto connected = co_await worker_.pool.connect(rank);
        if (!connected.connection) {
          // Nothing was sent: always safe to try another rank.
          co_return head_attempt{connected.error, "connect", upstream::request_outcome::connect_failure, true};
        }
        connection = std::move(connected.connection);
        shared_.metrics.upstream_connected(rank);
      }
      watch.upstream = connection.get();
      if (watch.client_gone) co_return head_attempt{asio::error::operation_aborted, "client", {}, false};
      parser.emplace();
      parser->header_limit(static_cast<std::uint32_t>(settings_.max_header_bytes));
      parser->body_limit(boost::none);  // responses stream through; nothing is collected
      if (head_request) parser->skip(true);

      connection->stream.expires_after(settings_.upstream_read_timeout);
      upstream_framing_.clear();
      http::append_request_head(upstream_framing_, request.base());
      const std::array<asio::const_buffer, 2> pieces{asio::buffer(upstream_framing_), asio::buffer(request.body())};
      auto [write_ec, written] = co_await asio::async_write(connection->stream, pieces, as_result);
      boost::system::error_code ec = write_ec;
      if (!ec) {
        connection->stream.expires_after(head_timeout);
        auto [read_ec, read] = co_await bhttp::async_read_header(connection->stream, connection->buffer, *parser, as_result);
        ec = read_ec;
      }
      if (!ec) co_return head_attempt{};
      if (watch.client_gone) co_return head_attempt{ec, "client", {}, false};
      const bool nothing_received = !parser->got_some();
      if (connection->reused && nothing_received && is_closed_connection(ec) && attempt < 2) {
        shared_.metrics.keepalive_retry(rank);
        continue;
      }
      if (ec == beast::error::timeout) {
        // The engine has the request and may be working on it: sending it elsewhere would double the work.
        co_return head_attempt{ec, "timeout", upstream::request_outcome::timeout, false};
      }
      if (nothing_received && is_closed_connection(ec)) {
        // Reset or closed on a fresh connection before any answer: the engine refused it.
        co_return head_attempt{ec, "reset", upstream::request_outcome::reset, true};
      }
      co_return head_attempt{ec, "protocol", upstream::request_outcome::reset, false};
    }
  }

  io::task<bool> fail_before_response(std::size_t rank, clock_type::time_point picked_at,
                                             const boost::system::error_code& ec, std::string_view kind,
                                             bool client_keep_alive) {
    const unsigned status = ec == beast::error::timeout ? 504 : 502;
    shared_.metrics.request_finished(rank, status, clock_type::now() - picked_at);
    const auto& backend = shared_.backends[rank];
    std::string message = status == 504 && kind == "connect"
                              ? "could not connect to backend rank " + std::to_string(rank) + " (" + backend.url +
                                    ") within --upstream-connect-timeout-ms"
                          : status == 504 ? "backend rank " + std::to_string(rank) + " (" + backend.url +
                                                ") sent no response head in time (--upstream-first-byte-timeout-ms)"
                                          : "dplb could not get a response from backend rank " + std::to_string(rank) +
                                              " (" + backend.url + "): " + std::string(kind) + ": " + ec.message();
    spdlog::warn("{}", message);
    co_return co_await send_error(status, message, client_keep_alive);
  }

  char* relay_buffer() {
    if (!relay_buffer_) relay_buffer_ = std::make_unique<char[]>(relay_buffer_size);
    return relay_buffer_.get();
  }

  worker_state& worker_;
  shared_state& shared_;
  const config::settings& settings_;
  io::tcp_stream client_;
  beast::flat_buffer buffer_;
  std::string client_address_;
  std::unique_ptr<char[]> relay_buffer_;
  std::string upstream_framing_;  // the request head for the engine, reused by every request
  std::string client_framing_;    // response head and chunk framing for the client, reused likewise
};

}  // namespace

io::task<void> run_session(worker_state& worker, io::socket socket) {
  session s(worker, std::move(socket));
  co_await s.run();
}

}  // namespace dplb::server
