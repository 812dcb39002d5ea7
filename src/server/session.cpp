#include "dplb/server/session.hpp"

#include <boost/asio/buffer.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <tuple>
#include <utility>

#include "buffered_parse.hpp"
#include "client_watch.hpp"
#include "dplb/http/error_response.hpp"
#include "dplb/http/header_sanitizer.hpp"
#include "dplb/http/message_head.hpp"
#include "dplb/server/admission.hpp"
#include "dplb/server/request_facts.hpp"
#include "dplb/support/io_buffers.hpp"
#include "request_accounting.hpp"
#include "response_relay.hpp"
#include "upstream_exchange.hpp"

namespace dplb::server {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
using tcp = asio::ip::tcp;
using clock_type = std::chrono::steady_clock;

namespace {

using io::as_result;

// A request body up to this size leaves its storage to the connection's next request; a larger one is
// freed once the engine has answered (it is needed only to retry elsewhere until then), so that neither
// a stream nor a connection that sent one long prompt keeps it for the rest of its life.
constexpr std::size_t kept_body_capacity = 4 * 1024;

// A connection that has waited this long for its next request gives back everything its last request
// left it: the read buffer, the body, the heads. Its wait goes on without a buffer, as a one-byte MSG_PEEK
// receive (nginx frees a keep-alive connection's buffers in the same way). A client that sends its next
// request sooner keeps them: a busy connection reuses its buffers and allocates nothing.
constexpr auto idle_release_delay = std::chrono::milliseconds(100);


class session {
 public:
  session(worker_state& worker, io::socket socket)
      : worker_(worker), shared_(worker.shared), settings_(worker.shared.settings), client_(std::move(socket)),
        buffer_(settings_.max_header_bytes + 64 * 1024), client_deadline_(worker.deadlines),
        upstream_deadline_(worker.deadlines) {
    client_deadline_.guard(&client_.socket());
    boost::system::error_code ec;
    auto remote = client_.socket().remote_endpoint(ec);
    client_address_ = ec ? "unknown" : remote.address().to_string();
    if (shared_.access_log && !ec) {
      const auto port = std::to_string(remote.port());
      client_endpoint_ = remote.address().is_v6() ? "[" + client_address_ + "]:" + port : client_address_ + ":" + port;
    }
    client_.socket().set_option(tcp::no_delay(true), ec);
    client_.socket().non_blocking(true, ec);  // written directly when the kernel takes it (write_now.hpp)
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

    // A drain lets the request in progress finish, then closes. The response says Connection: close when
    // its head is written after the drain began; one written before says keep-alive, and the client sees
    // the close as any idle keep-alive connection's.
    try {
      for (;;) {
        const bool again = co_await serve_one_request();
        if (access_open_) log_access();
        if (!again || shared_.draining.load(std::memory_order_relaxed)) break;
      }
    } catch (const std::exception& e) {
      // Errors on the request path are values; an exception here is a bug, and costs only this connection.
      spdlog::error("closing a client connection after an unexpected error: {}", e.what());
    }
    // Here, not in a destructor: a session still waiting when its worker is torn down is destroyed with
    // the event loop, after the worker's idle set.
    worker_.idle_clients.leave(idle_slot_);
    boost::system::error_code ec;
    client_.socket().shutdown(tcp::socket::shutdown_send, ec);
    client_.socket().close(ec);
  }

 private:
  // Reads and answers one request. Returns whether the connection stays open for another.
  io::task<bool> serve_one_request() {
    reuse_request_body();
    http::request_head_parser parser(request_head_, request_body_);
    parser.header_limit(static_cast<std::uint32_t>(settings_.max_header_bytes));
    parser.body_limit(settings_.max_request_body_bytes);

    client_deadline_.expires_after(settings_.client_idle_timeout);
    worker_.idle_clients.enter(client_, idle_slot_);
    head_reader reader(buffer_, settings_.max_header_bytes);
    auto head_ec = reader.scan();  // a pipelined request may be here already
    if (head_ec == head_reader::need_more) {
      client_deadline_.wake_at(clock_type::now() + idle_release_delay, &session::release_when_idle, this);
    }
    while (head_ec == head_reader::need_more) {
      auto [read_ec, n] = co_await client_.socket().async_read_some(reader.space(), as_result);
      if (std::exchange(releasing_, false) && read_ec == asio::error::operation_aborted &&
          !shared_.draining.load(std::memory_order_relaxed)) {
        // The read was cancelled to give the buffers back (release_when_idle): wait without them.
        if (auto wait_ec = co_await wait_while_idle()) head_ec = reader.read(wait_ec, 0);
        continue;
      }
      head_ec = reader.read(read_ec, n);
    }
    client_deadline_.cancel_wake();
    head_ec = timed(head_ec);
    worker_.idle_clients.leave(idle_slot_);
    if (head_ec == bhttp::error::bad_field) {
      co_return co_await reject(400, "obsolete line folding in a header is not accepted (RFC 9112 5.2)", false);
    }
    if (head_ec) co_return co_await refuse_unreadable_request(head_ec, buffer_.size() > 0);
    // The whole head is in the buffer now: it is parsed without any I/O, into views of the buffer that
    // stay valid until the body is read (which may move the bytes).
    if (auto ec = parse_buffered(parser, buffer_, [&] { return parser.is_header_done(); })) {
      co_return co_await refuse_unreadable_request(ec == bhttp::error::need_more ? bhttp::error::partial_message : ec,
                                                   true);
    }

    const auto& head = request_head_;
    if (shared_.access_log) begin_access(head.method_string, head.target);
    client_version_ = head.version;
    const auto method = head.method;
    const auto decision = admit(head);
    // Decided while the target's view into the buffer is valid: the buffer is given back once the body is in.
    const bool models_list = shared_.models.by_model() && is_models_list(method, decision.target());
    if (decision.refused()) co_return co_await reject(decision.refusal_status, decision.refusal_message, false);
    if (decision.route == request_route::proxy &&
        !prepare_upstream_request(head, decision.target(), client_address_, upstream_head_)) {
      co_return co_await reject(431, "X-Forwarded-For or Via is too long to append to", false);
    }
    // Copied now: the head's views do not outlive the body's reading.
    if (!settings_.affinity_header.empty()) session_key_ = head.fields.value(settings_.affinity_header);
    if (decision.send_continue && !co_await send_continue()) co_return false;
    // The body, or what of it arrived with the head, is parsed without I/O; only the rest is read.
    parser.eager(true);
    auto body_ec = parse_buffered(parser, buffer_, [&] { return parser.is_done(); });
    if (body_ec == bhttp::error::need_more) body_ec = co_await read_rest_of_body(parser);
    if (body_ec) co_return co_await refuse_unreadable_request(body_ec, true);
    // The request is in: its read buffer goes back (unless a pipelined request's bytes are in it) rather
    // than stay with the connection while the response streams, perhaps for minutes.
    io::release_if_empty(buffer_);
    body_bytes_.set(request_body_.capacity());

    const bool keep_alive = parser.keep_alive() && !shared_.draining.load(std::memory_order_relaxed);
    switch (decision.route) {
      // dplb's own paths are for its operators' tools, not traffic: not in the access log.
      case request_route::metrics:
      case request_route::health: {
        const bool again = co_await serve_own_path(method, decision.route == request_route::metrics ? "/metrics" : "/health",
                                                   keep_alive);
        access_open_ = false;
        co_return again;
      }
      case request_route::proxy: break;
    }
    if (decision.pinned_rank_conflict) {
      co_return co_await reject(400, "request has X-data-parallel-rank headers that disagree; send one", keep_alive);
    }
    if (models_list) co_return co_await serve_models_list(method, keep_alive);
    co_return co_await proxy(method, keep_alive, decision.pinned_rank);
  }

  // The rarer steps of reading a request are coroutines of their own, so that their state is not part of
  // serve_one_request's frame: that frame is allocated for every request, and Asio's per-thread recycling
  // cache only keeps blocks of up to 1020 bytes (255 chunks of 4). A larger frame was allocated and freed
  // for every request, and each such allocation also evicted a cached block that the next frame needed.
  io::task<bool> send_continue() {
    static constexpr std::string_view continue_line = "HTTP/1.1 100 Continue\r\n\r\n";
    client_deadline_.expires_after(settings_.client_write_timeout);
    auto [ec, n] = co_await asio::async_write(client_.socket(), asio::buffer(continue_line), as_result);
    client_deadline_.expires_never();
    co_return !ec;
  }

  io::task<boost::system::error_code> read_rest_of_body(http::request_head_parser& parser) {
    client_deadline_.expires_after(settings_.request_read_timeout);
    auto [ec, n] = co_await bhttp::async_read(client_.socket(), buffer_, parser, as_result);
    co_return timed(ec);
  }

  // The client operation just completed is over, and so is its deadline: an operation that failed because
  // the deadline passed (the sweeper closed the socket) reports a timeout.
  boost::system::error_code timed(boost::system::error_code ec) {
    client_deadline_.expires_never();
    return ec && client_deadline_.expired() ? beast::error::timeout : ec;
  }

  // The body string is kept from request to request, unless one request left it large: a client that once
  // sent a big prompt must not pin that much memory for the life of its connection.
  void reuse_request_body() {
    request_body_.clear();
    release_large_body();
  }
  void release_large_body() {
    if (request_body_.capacity() > kept_body_capacity) std::string().swap(request_body_);
    body_bytes_.set(request_body_.capacity());
  }

  // Called by the deadline sweeper once the connection has waited idle_release_delay for a request head:
  // cancels the read, unless part of a head is in the buffer, so that the session gives its memory back.
  static void release_when_idle(void* self) {
    auto& s = *static_cast<session*>(self);
    if (s.buffer_.size() != 0) return;  // a head arriving slowly: it keeps its buffer
    s.releasing_ = true;
    boost::system::error_code ignored;
    s.client_.socket().cancel(ignored);  // completes through the event loop, never inline
  }

  // An idle connection's wait for its next request, holding no buffer: what the last request left is
  // freed, and the first byte of the next is awaited with a one-byte MSG_PEEK receive (nothing consumed).
  // Returns the receive's error (end of file: the client closed), or none once a byte is there to read.
  io::task<boost::system::error_code> wait_while_idle() {
    io::release_if_empty(buffer_);
    std::string().swap(request_body_);
    body_bytes_.set(0);
    std::string().swap(client_framing_);
    std::string().swap(session_key_);
    upstream_head_ = {};
    request_head_ = {};
    response_head_ = {};
    prefix_chain_ = {};
    if (!access_open_) access_ = {};
    auto [ec, n] = co_await client_.socket().async_receive(asio::buffer(&idle_probe_, 1),
                                                           io::socket::message_peek, as_result);
    co_return ec;
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
      if (shared_.access_log) answered_by_dplb(408, 0);
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
                                   bool retry_later = false, std::string_view param = {}) {
    bhttp::response<bhttp::string_body> response{static_cast<bhttp::status>(status), 11};
    response.set(bhttp::field::content_type, "application/json");
    if (retry_later) response.set(bhttp::field::retry_after, "1");
    response.body() = http::error_body(status, message, param);
    co_return co_await send_local(response, keep_alive, false);
  }

  io::task<bool> send_local(bhttp::response<bhttp::string_body>& response, bool keep_alive,
                                   bool head_request) {
    keep_alive = keep_alive && !shared_.draining.load(std::memory_order_relaxed);  // a drain closes after it
    set_connection_header(response, keep_alive, client_version_);
    response.prepare_payload();
    if (head_request) response.body().clear();  // Content-Length still tells the size of a GET
    if (shared_.access_log) answered_by_dplb(response.result_int(), response.body().size());
    client_deadline_.expires_after(settings_.client_write_timeout);
    auto [ec, n] = co_await bhttp::async_write(client_.socket(), response, as_result);
    client_deadline_.expires_never();
    co_return !ec && keep_alive;
  }

  static bool is_models_list(bhttp::verb method, std::string_view target) {
    return (method == bhttp::verb::get || method == bhttp::verb::head) &&
           target.substr(0, target.find('?')) == "/v1/models";
  }

  // With clusters no one engine knows every model: dplb answers GET /v1/models with their union.
  io::task<bool> serve_models_list(bhttp::verb method, bool keep_alive) {
    bhttp::response<bhttp::string_body> response{bhttp::status::ok, 11};
    response.set(bhttp::field::content_type, "application/json");
    const auto now = std::chrono::system_clock::now().time_since_epoch();
    response.body() = shared_.models.models_list(std::chrono::duration_cast<std::chrono::seconds>(now).count());
    co_return co_await send_local(response, keep_alive, method == bhttp::verb::head);
  }

  io::task<bool> serve_own_path(bhttp::verb method, std::string_view path, bool keep_alive) {
    const bool head_request = method == bhttp::verb::head;
    if (method != bhttp::verb::get && !head_request) {
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

  // A slot on a rank with --max-inflight-per-rank: at once, or after a wait in dplb's queue (its discipline
  // is in balancer.hpp), bounded by --queue-timeout-ms. The waiter keeps `request` with its views of this
  // session's prefix_chain_ and session_key_: they stay put while the session is suspended here, and the
  // balancer reads them only until it delivers a lease or cancel_wait() returns.
  io::task<slot_result> wait_for_slot(const balancer::pick_context& request, balancer::request_cost cost) {
    struct wait_state {
      explicit wait_state(const io::executor& ex) : timer(ex) {}
      io::steady_timer timer;
      balancer::rank_lease lease;
      bool gave_up = false;
      bool waking = false;       // the wait is over: the client watch must not touch it any more
      bool client_gone = false;  // the client closed or reset its connection while queued
      bool turned_away = false;  // the balancer can never serve it (removed ranks)
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
        state->turned_away = !lease;  // its rank (or every rank of its cluster) was removed
        state->lease = std::move(lease);
        state->timer.cancel();
      });
    };
    auto lease = shared_.balancer.acquire_or_wait(request, cost, deliver, waiter_id, queued);
    if (lease) co_return slot_result{std::move(lease)};
    if (!queued) {
      // Refused at once: the queue is full, or no rank (the pinned one, for a pinned request) is usable.
      const bool usable = request.pinned_rank ? shared_.balancer.usable(*request.pinned_rank)
                                              : shared_.balancer.any_usable(request.cluster);
      co_return slot_result{{}, usable ? slot_refusal::queue_full : slot_refusal::no_usable_rank};
    }
    const auto waiting_since = clock_type::now();
    // A waiter holding out for its own full rank stops holding out after the balancer's placement_wait;
    // no other event may come by then (no release, no arrival), so it wakes itself once to be served anew.
    const auto placement = shared_.balancer.placement_wait();
    bool reconsidered = !(placement.count() > 0 && placement < settings_.queue_timeout);
    state->timer.expires_after(reconsidered ? settings_.queue_timeout : placement);
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
    for (;;) {
      auto [wait_ec] = co_await state->timer.async_wait(as_result);
      if (wait_ec || reconsidered || state->lease || state->client_gone || state->turned_away) break;
      reconsidered = true;
      state->timer.expires_at(waiting_since + settings_.queue_timeout);
      shared_.balancer.reconsider();  // may deliver to this waiter: the hand-over is posted, then cancels the timer
    }
    state->waking = true;
    boost::system::error_code ignored;
    client_.socket().cancel(ignored);  // ends the watch; nothing else is pending on the client socket
    shared_.metrics.queued(clock_type::now() - waiting_since);
    if (state->lease && !state->client_gone) co_return slot_result{std::move(state->lease)};
    state->gave_up = true;
    shared_.balancer.cancel_wait(waiter_id);  // if it was served meanwhile, the posted lease is released
    state->lease.release();                   // served, but the client has left: the slot goes on
    co_return slot_result{{}, state->client_gone   ? slot_refusal::client_gone
                              : state->turned_away ? slot_refusal::no_usable_rank
                                                   : slot_refusal::queue_timeout};
  }

  // Picks a rank, sends it the request and relays the response. Returns whether the client
  // connection may carry another request.
  io::task<bool> proxy(bhttp::verb method, bool client_keep_alive, std::optional<std::int64_t> pinned) {
    const unsigned client_version = client_version_;
    set_upstream_framing(upstream_head_, method, request_body_.size());
    balancer::pick_context request;
    balancer::request_cost cost;
    const auto rank_count = shared_.topology.ranks().size();
    if (pinned) {
      if (*pinned < 0 || static_cast<std::uint64_t>(*pinned) >= rank_count) {
        shared_.metrics.rejected(400);
        co_return co_await send_error(400, "X-data-parallel-rank " + std::to_string(*pinned) +
                                               " is out of range: dplb serves ranks 0.." + std::to_string(rank_count - 1),
                                      client_keep_alive);
      }
      request.pinned_rank = static_cast<std::size_t>(*pinned);
    }
    // The body is read only when something depends on it: the model picks the cluster (clusters), or
    // the cluster's policy weighs tokens.
    const auto& models = shared_.models;
    request.cluster = models.default_cluster();
    if (request.pinned_rank) request.cluster = shared_.topology.ranks()[*request.pinned_rank].cluster;
    if (models.by_model() || shared_.balancer.active_policy().needs_request_facts()) {
      auto facts = inspect_request_body(request_body_, wants_prefix_chain_);
      if (access_open_) access_.model = facts.model;
      if (models.by_model() && !facts.model.empty()) {
        const auto served = models.cluster_of(facts.model);
        if (!served) {
          // As vLLM answers a model it does not serve.
          shared_.metrics.rejected(404);
          co_return co_await send_error(404, "The model `" + facts.model + "` does not exist.", client_keep_alive,
                                        false, "model");
        }
        if (request.pinned_rank && *served != request.cluster) {
          shared_.metrics.rejected(400);
          co_return co_await send_error(400, "X-data-parallel-rank " + std::to_string(*request.pinned_rank) +
                                                 " is not a rank of the cluster serving `" + facts.model + "`",
                                        client_keep_alive);
        }
        request.cluster = *served;
      }
      if (shared_.balancer.policy_of(request.cluster).needs_request_facts()) cost = cost_of(facts, request);
    }
    request.session_key = session_key_;
    // Without --max-inflight-per-rank a slot is taken at once, without a coroutine of its own. (Not a
    // conditional expression around co_await: GCC 12 destroys its temporaries twice, a lease among them.)
    slot_result slot;
    if (shared_.balancer.queueing()) {
      slot = co_await wait_for_slot(request, cost);
    } else {
      slot.lease = shared_.balancer.acquire(request, cost);
      slot.refusal = slot_refusal::no_usable_rank;  // read only when there is no lease
    }
    auto lease = std::move(slot.lease);
    if (slot.refusal == slot_refusal::client_gone) {
      // Counted as nginx counts a client that closes first (499), among the rejected: it never had a
      // rank to be counted on in dplb_requests_total. Nobody is left to answer.
      shared_.metrics.rejected(499);
      if (access_open_) answered_by_dplb(499, 0);
      co_return false;
    }
    if (!lease) {
      const unsigned status = slot.refusal == slot_refusal::queue_full ? 429 : 503;
      shared_.metrics.rejected(status);
      const std::string why =
          slot.refusal == slot_refusal::queue_full
              ? "every rank is at --max-inflight-per-rank and dplb's queue is full; retry later"
          : slot.refusal == slot_refusal::queue_timeout ? "no rank slot freed within --queue-timeout-ms; retry later"
          : request.pinned_rank
              ? "rank " + std::to_string(*request.pinned_rank) +
                    " (named by X-data-parallel-rank) is not usable now (down, ejected, drained or removed); retry later"
          : shared_.models.by_model()
              ? "no rank of the cluster serving this request is usable; check its engines and their /health"
              : "no backend rank is usable; check the engines and their /health";
      co_return co_await send_error(status, why, client_keep_alive, true);
    }
    const bool head_request = method == bhttp::verb::head;

    // While dplb waits for the engine and relays its answer, a watcher notices the client leaving and
    // closes the engine connection at once: that is how vLLM learns to abort the request. The watch starts
    // at the first deadline sweep one sweep period from now (25 ms with the default timeouts, up to twice
    // that): most requests are over by then, and never pay for a watch (a receive and its cancellation
    // through the event loop) nor for a sweep.
    if (!watch_) watch_ = std::make_shared<client_watch>();
    auto& watch = watch_;
    *watch = client_watch{};  // a cancelled receive of an earlier request sees operation_aborted, not this
    watch_started_ = false;
    client_deadline_.wake_at(clock_type::now() + worker_.deadlines.period(), &session::start_watch, this);
    struct stop_watch_on_exit {
      session& s;
      ~stop_watch_on_exit() {
        s.client_deadline_.cancel_wake();
        s.watch_->done = true;
        s.watch_->upstream = nullptr;
        if (s.watch_started_) {
          boost::system::error_code ignored;
          s.client_.socket().cancel(ignored);
        }
      }
    } stop_watch{*this};

    request_accounting accounting(shared_, std::move(lease), access_open_ ? &access_ : nullptr);
    upstream_exchange exchange(worker_, *watch, response_head_, upstream_deadline_);
    std::vector<bool> tried;  // sized on the first retry only: the usual request never needs it
    for (std::size_t retries = 0;; ++retries) {
      const auto attempt = co_await exchange.send(accounting.rank(), upstream_head_, request_body_, head_request);
      if (!attempt.ec) break;
      if (watch->client_gone) {
        accounting.finish(499);
        co_return false;
      }
      accounting.attempt_failed(attempt.kind, attempt.health);
      // A pinned request has one rank: it never moves to another.
      if (attempt.retry_elsewhere && retries < settings_.max_retries && !request.pinned_rank) {
        // Nothing reached the engine's application and nothing reached the client: try another rank.
        // The ranks behind the same URL share the failed server: none of them is tried either.
        const auto ranks = shared_.topology.ranks();
        const auto& failed = shared_.topology.backends()[ranks[accounting.rank()].backend];
        tried.resize(ranks.size());
        std::fill_n(tried.begin() + static_cast<std::ptrdiff_t>(failed.first_rank), failed.dp, true);
        request.avoid = &tried;
        if (auto next = shared_.balancer.acquire(request, cost)) {
          spdlog::debug("rank {} failed ({}); retrying on rank {}", accounting.rank(), attempt.ec.message(),
                        next.rank());
          accounting.move_to(std::move(next));
          continue;
        }
      }
      co_return co_await fail_before_response(accounting, attempt.ec, attempt.kind, client_keep_alive);
    }

    const std::size_t rank = accounting.rank();
    accounting.answered(exchange.response_head().status);
    release_large_body();  // the engine has answered: nothing will be retried
    response_relay relay(client_.socket(), client_deadline_, exchange, settings_, client_framing_);
    // A drain that began while the engine worked closes the connection after this response: say so.
    const bool keep_client = relay.prepare_head(rank, head_request, client_version,
                                                client_keep_alive && !shared_.draining.load(std::memory_order_relaxed));
    const auto relayed = co_await relay.run(accounting);
    access_.bytes = relay.body_bytes();
    if (watch->client_gone || relayed == response_relay::result::client_failed) {
      // The client went away: dropping the engine connection is how vLLM learns to abort the request.
      // (If the engine had already finished, the request was counted with its status.)
      accounting.finish(499);
      co_return false;
    }
    if (relayed == response_relay::result::engine_failed) {
      // The engine closed the connection mid-response, or fell silent past --upstream-read-timeout-ms (the
      // deadline closed it): a "midstream" error either way, as the metric counts it.
      const bool silent = upstream_deadline_.expired();
      accounting.attempt_failed("midstream", silent ? upstream::request_outcome::timeout : upstream::request_outcome::reset);
      if (!relay.head_sent()) {
        // Nothing reached the client yet (the head was held back to leave with the first body bytes): the
        // client can still get a proper error, 504 for the silence.
        co_return co_await fail_before_response(
            accounting, silent ? boost::system::error_code(beast::error::timeout) : asio::error::connection_reset,
            "midstream", client_keep_alive);
      }
      // Part of the response is already out: closing without the terminating chunk (or short of the
      // Content-Length) is the only way left to tell the client the response is incomplete.
      accounting.finish(accounting.status());
      spdlog::warn("rank {} ({}) failed mid-response; the client sees a truncated response", rank,
                   shared_.topology.ranks()[rank].name);
      co_return false;
    }
    exchange.give_back_if_clean(rank);
    co_return keep_client;
  }

  // What the request costs in tokens, from its body (for a policy that asks): the prompt, and the most it
  // may generate (max_tokens, else --default-max-tokens, times n). A separate function, so that the facts
  // are not part of proxy()'s coroutine frame.
  balancer::request_cost cost_of(request_facts& facts, balancer::pick_context& request) {
    const std::uint64_t decode =
        std::uint64_t{facts.max_tokens.value_or(settings_.default_max_tokens)} * std::max<std::uint32_t>(1, facts.choices);
    const balancer::request_cost cost{facts.prompt_tokens, static_cast<std::uint32_t>(std::min<std::uint64_t>(decode, UINT32_MAX))};
    request.prompt_tokens = cost.prompt;
    request.decode_tokens = cost.decode;
    // Kept by the session: the pick may wait in the queue, and the chain must live as long.
    prefix_chain_ = std::move(facts.prefix_chain);
    request.prefix_chain = prefix_chain_;
    return cost;
  }

  // The client's answer when the request got no response from an engine. A request that reached no engine
  // (every connection attempt failed, the last one on this rank) gets 503 with Retry-After, as from
  // HAProxy or Envoy: nothing was sent anywhere, and trying again later is safe. An engine that took the
  // request and said nothing in time gives 504; one that failed while answering, 502. The slot is free
  // before the answer leaves: a client that saw the error also sees the slot free.
  io::task<bool> fail_before_response(request_accounting& accounting, const boost::system::error_code& ec,
                                      std::string_view kind, bool client_keep_alive) {
    const bool not_delivered = kind == "connect";
    const unsigned status = not_delivered ? 503 : ec == beast::error::timeout ? 504 : 502;
    accounting.finish(status);
    const auto rank = accounting.rank();
    const auto where = "backend rank " + std::to_string(rank) + " (" + shared_.topology.ranks()[rank].name + ")";
    std::string message =
        not_delivered
            ? "no backend rank could take the request; the last tried, " + where +
                  (ec == beast::error::timeout ? ", did not accept a connection within --upstream-connect-timeout-ms"
                                               : ", refused the connection: " + ec.message())
        : status == 504 ? where + " did not answer in time (--upstream-first-byte-timeout-ms, --upstream-read-timeout-ms)"
                        : "dplb could not get a response from " + where + ": " + std::string(kind) + ": " + ec.message();
    spdlog::warn("{}", message);
    co_return co_await send_error(status, message, client_keep_alive, not_delivered);
  }

  // Called by the deadline sweeper (see proxy()).
  static void start_watch(void* self) {
    auto& s = *static_cast<session*>(self);
    s.watch_started_ = true;
    watch_client(s.client_.socket(), s.watch_);
  }

  // The access log (--access-log): an entry opens when a request's head is read (or when dplb answers one it
  // could not read), collects what the accounting and the relay learn, and is written once the response is out.
  void begin_access(std::string_view method, std::string_view target) {
    access_ = metrics::access_entry{};
    access_.time = std::chrono::system_clock::now();
    access_.started = clock_type::now();
    access_.method = method;
    access_.path = target;
    access_.client = client_endpoint_;
    access_open_ = true;
  }
  // dplb answered (or, for 408 and 499, gave up on) the request itself: unless a rank's accounting already
  // set them, these are the status and body size the client got.
  void answered_by_dplb(unsigned status, std::size_t body_bytes) {
    if (!access_open_) begin_access({}, {});  // a request too malformed to have a method and a path
    if (!access_.rank) access_.status = status;  // else the accounting has it (an error sent for a rank)
    access_.bytes = body_bytes;
  }
  void log_access() {
    access_open_ = false;
    if (access_.status == 0) access_.status = 499;  // the client left before any answer
    shared_.access_log->write(metrics::format_access_line(access_, clock_type::now()));
  }

  worker_state& worker_;
  shared_state& shared_;
  const config::settings& settings_;
  io::tcp_stream client_;  // its own timer is never armed: client_deadline_ keeps the deadlines
  io::read_buffer buffer_;  // holds a block only while a request is read (io_buffers.hpp)
  socket_deadline client_deadline_;    // guards the client's socket
  socket_deadline upstream_deadline_;  // guards the engine connection the request in progress uses
  std::string client_address_;
  std::string client_endpoint_;  // "address:port", for the access log
  metrics::access_entry access_;  // the request being served, while access_open_
  bool access_open_ = false;
  unsigned client_version_ = 11;  // of the request being served: how its responses say keep-alive
  std::shared_ptr<client_watch> watch_;  // of the request being proxied, made once per connection
  bool watch_started_ = false;
  std::size_t idle_slot_ = idle_client_set::not_member;  // in worker_.idle_clients while waiting for a head
  bool releasing_ = false;  // release_when_idle cancelled the head read
  char idle_probe_ = 0;     // where the idle wait's MSG_PEEK copies a byte (never read)
  // Reused by every request of the connection, so that the steady state allocates nothing:
  http::request_head request_head_;    // views into buffer_
  std::string session_key_;            // --affinity-header's value in the request being served
  std::vector<std::uint64_t> prefix_chain_;  // its prompt's prefix blocks (prefix-aware), for the pick
  const bool wants_prefix_chain_ = config::any_cluster_uses(settings_, "prefix-aware");
  std::string request_body_;           // de-chunked
  io::tracked_bytes body_bytes_;       // its capacity, for the memory trimmer
  upstream_head upstream_head_;        // the engine's request head, written from request_head_
  http::response_head response_head_;  // views into the engine connection's buffer
  std::string client_framing_;         // the client's response head and chunk framing
};

}  // namespace

io::task<void> run_session(worker_state& worker, io::socket socket) {
  session s(worker, std::move(socket));
  co_await s.run();
}

}  // namespace dplb::server
