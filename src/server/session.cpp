#include "dplb/server/session.hpp"

#include <boost/asio/buffer.hpp>
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

#include "access_record.hpp"
#include "buffered_parse.hpp"
#include "client_watch.hpp"
#include "dplb/http/header_sanitizer.hpp"
#include "dplb/http/message_head.hpp"
#include "dplb/pd/leg_bodies.hpp"
#include "dplb/server/admission.hpp"
#include "dplb/server/request_facts.hpp"
#include "dplb/support/io_buffers.hpp"
#include "dplb/upstream/model_context.hpp"
#include "kv_request.hpp"
#include "ledger_pick.hpp"
#include "own_replies.hpp"
#include "request_accounting.hpp"
#include "request_id.hpp"
#include "response_relay.hpp"
#include "slot_wait.hpp"
#include "tenant_admission.hpp"
#include "tenant_pass.hpp"
#include "two_leg_request.hpp"
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
        upstream_deadline_(worker.deadlines), replies_(client_, client_deadline_, shared_, access_, tenant_) {
    client_deadline_.guard(&client_.socket());
    boost::system::error_code ec;
    auto remote = client_.socket().remote_endpoint(ec);
    client_address_ = ec ? "unknown" : remote.address().to_string();
    if (shared_.access_log && !ec) {
      const auto port = std::to_string(remote.port());
      access_.set_client(remote.address().is_v6() ? "[" + client_address_ + "]:" + port : client_address_ + ":" + port);
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
        if (access_.is_open()) access_.write_to(*shared_.access_log);
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
    tenant_.end();  // the last request's: this one's tenant is not known until its head is in
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
    // Every refusal is answered at the one co_await after this block (see own_replies::refusal).
    own_replies::refusal refused;
    do {
      if (head_ec == bhttp::error::bad_field) {
        refused = {400, "obsolete line folding in a header is not accepted (RFC 9112 5.2)"};
        break;
      }
      if (head_ec) {
        refused = own_replies::unreadable(head_ec, buffer_.size() > 0);
        break;
      }
      // The whole head is in the buffer now: it is parsed without any I/O, into views of the buffer that
      // stay valid until the body is read (which may move the bytes).
      if (auto ec = parse_buffered(parser, buffer_, [&] { return parser.is_header_done(); })) {
        refused = own_replies::unreadable(ec == bhttp::error::need_more ? bhttp::error::partial_message : ec, true);
        break;
      }

      const auto& head = request_head_;
      if (shared_.access_log) access_.begin(head.method_string, head.target);
      replies_.set_client_version(head.version);
      const auto method = head.method;
      const auto decision = admit(head);
      // Decided while the target's view into the buffer is valid: the buffer is given back once the body is in.
      const bool models_list = shared_.models.by_model() && is_models_list(method, decision.target());
      const bool two_legs = reads_.disaggregated() && is_completion(method, decision.target());
      if (decision.refused()) {
        refused = {decision.refusal_status, decision.refusal_message};
        break;
      }
      // Whose request it is, read while the head's views are valid (the key is digested, never kept).
      if (decision.route == request_route::proxy) identify_tenant(head);
      if (decision.route == request_route::proxy && settings_.require_api_key && !known_key_) {
        // Before the body is read (and before any 100 Continue): no engine, and not even dplb's buffers, for a
        // request without a key. Counted under default, whatever tenant its header named: a caller without a
        // key cannot write into another tenant's series. The body is unread: the connection closes.
        tenant_.begin(shared_.tenants.identify({}, {}).tenant);
        if (access_.is_open()) access_.entry().tenant = tenant_.tenant().name();
        refused = {401, "this endpoint requires an API key: send Authorization: Bearer <key> with a key configured "
                        "for your tenant"};
        break;
      }
      if (decision.route == request_route::proxy &&
          !prepare_upstream_request(head, decision.target(), client_address_, upstream_head_)) {
        refused = {431, "X-Forwarded-For or Via is too long to append to"};
        break;
      }
      // The engines' X-Request-Id: unique per request, whatever the client sent; both legs of a disaggregated
      // request carry the same one (request_id.hpp).
      if (decision.route == request_route::proxy) {
        assign_request_ids(head.fields, two_legs, upstream_head_.bytes, upstream_head_.request_line_end, request_ids_);
        if (access_.is_open()) {
          access_.entry().request_id = request_ids_.engine;
          access_.entry().client_request_id = request_ids_.client;
        }
      }
      // Copied now: the head's views do not outlive the body's reading.
      if (!settings_.affinity_header.empty()) session_key_ = head.fields.value(settings_.affinity_header);
      if (decision.send_continue && !co_await send_continue()) co_return false;
      // The body, or what of it arrived with the head, is parsed without I/O; only the rest is read.
      parser.eager(true);
      auto body_ec = parse_buffered(parser, buffer_, [&] { return parser.is_done(); });
      if (body_ec == bhttp::error::need_more) body_ec = co_await read_rest_of_body(parser);
      if (body_ec) {
        refused = own_replies::unreadable(body_ec, true);
        break;
      }
      // The request is in: its read buffer goes back (unless a pipelined request's bytes are in it) rather
      // than stay with the connection while the response streams, perhaps for minutes.
      io::release_if_empty(buffer_);
      body_bytes_.set(request_body_.capacity());

      const bool keep_alive = parser.keep_alive() && !shared_.draining.load(std::memory_order_relaxed);
      if (decision.route != request_route::proxy) {
        // dplb's own paths are for its operators' tools, not traffic: not in the access log.
        const bool again = co_await replies_.own_path(
            method, decision.route == request_route::metrics ? "/metrics" : "/health", keep_alive);
        access_.drop();
        co_return again;
      }
      if (decision.pinned_rank_conflict) {
        refused = {400, "request has X-data-parallel-rank headers that disagree; send one", keep_alive};
        break;
      }
      if (models_list) co_return co_await replies_.models_list(method, keep_alive);
      co_return co_await proxy(method, keep_alive, decision.pinned_rank, two_legs);
    } while (false);
    co_return co_await replies_.refuse(refused);
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
    request_ids_ = {};
    std::string().swap(refusal_.message);
    upstream_head_ = {};
    request_head_ = {};
    response_head_ = {};
    prefix_chain_ = {};
    kv_ = {};
    access_.release_if_closed();
    auto [ec, n] = co_await client_.socket().async_receive(asio::buffer(&idle_probe_, 1),
                                                           io::socket::message_peek, as_result);
    co_return ec;
  }

  // Picks a rank, sends it the request and relays the response. Returns whether the client
  // connection may carry another request.
  io::task<bool> proxy(bhttp::verb method, bool client_keep_alive, std::optional<std::int64_t> pinned, bool two_legs) {
    request_started_ = clock_type::now();
    balancer::pick_context request;
    balancer::request_cost cost;
    balancer::rank_lease lease;
    bool admitted = describe_request(pinned, request, cost) && leaves_kv_params_to_dplb(request);
    if (admitted) admitted = co_await admit_by_tenant();
    if (admitted) {  // else refusal_ says why
      set_upstream_framing(upstream_head_, method, request_body_.size());  // the body is final (min_priority)
      if (kv_.awaits_tokens()) co_await kv_.tokenize(request_body_, shared_, request);
      request.prefilled_elsewhere = two_legs && settings_.clusters[request.cluster].disaggregated();
      // A disaggregated cluster's completion takes its decode rank once its prefill has answered.
      if (request.prefilled_elsewhere) co_return co_await run_two_legs(request, cost, client_keep_alive);
      auto slot = co_await take_slot(client_, shared_, request, cost, ticket_,
                                     [&] { return ticket_for(tenant_, priority_, tenant_tokens_, settings_); });
      lease = std::move(slot.lease);
      if (slot.refusal == slot_refusal::client_gone) {
        // Counted as nginx counts a client that closes first (499), among the rejected: it never had a
        // rank to be counted on in dplb_requests_total. Nobody is left to answer.
        shared_.metrics.rejected(499);
        tenant_.answered(499);
        if (access_.is_open()) access_.answered_by_dplb(499, 0);
        co_return false;
      }
      if (!lease) {
        refusal_ = {refusal_status(slot.refusal), refusal_message(slot.refusal, request, shared_.models.by_model())};
        refusal_.retry_after = 1;
      }
    }
    if (!lease) {
      tenant_.give_back_reservation();  // no engine saw it: before the answer, so a retry finds its tokens there
      shared_.metrics.rejected(refusal_.status);
      co_return co_await replies_.send_error(refusal_.status, refusal_.message, client_keep_alive,
                                             refusal_.retry_after, refusal_.param, refusal_.code);
    }
    tenant_.holding_slot();
    co_return co_await exchange_and_relay(std::move(lease), request, cost, method == bhttp::verb::head,
                                          client_keep_alive);
  }

  // A disaggregated cluster's completion, in two legs (two_leg_request.hpp): the prefill leg, then the decode
  // leg on the decode rank picked when the prefill answered. The decode leg, a prefill answer relayed as it
  // came and a prefill leg's failure go the way of any request's.
  io::task<bool> run_two_legs(balancer::pick_context& request, balancer::request_cost cost, bool client_keep_alive) {
    two_leg_request legs({.worker = worker_, .client = client_, .client_deadline = client_deadline_,
                          .upstream_deadline = upstream_deadline_, .watch = watch_, .access = access_, .tenant = tenant_,
                          .replies = replies_, .response_head = response_head_, .engine_head = upstream_head_,
                          .body = request_body_, .body_bytes = body_bytes_, .ticket = ticket_, .priority = priority_,
                          .tokens = tenant_tokens_});
    const auto step = co_await legs.run(request, cost, client_keep_alive);
    if (step == two_leg_request::next::answered) co_return legs.keep_alive();
    if (step == two_leg_request::next::relay_prefill) {
      co_return co_await relay_answer(legs.prefill().exchange(), legs.prefill().accounting(), false, client_keep_alive);
    }
    if (step == two_leg_request::next::prefill_failed) {
      const auto& failure = legs.prefill().failure();
      co_return co_await fail_before_response(legs.prefill().accounting(), failure.ec, failure.kind, client_keep_alive);
    }
    // Without a prefill leg the decode rank prefills the prompt (its rest; all of it on a retry elsewhere).
    if (legs.prefill_skipped()) request.prefilled_elsewhere = false;
    co_return co_await exchange_and_relay(legs.take_decode_lease(), request, cost, false, client_keep_alive,
                                          request_started_);
  }

  // While dplb waits for an engine and relays its answer, a watcher notices the client leaving and closes
  // the engine connection at once: that is how vLLM learns to abort the request (client_watch.hpp).
  leg_watch watch_leg() { return leg_watch(client_deadline_, client_.socket(), watch_, worker_.deadlines.period()); }

  // Sends the request to the rank of `lease` (to another on a failure that allows it) and relays the
  // response. A coroutine of its own, apart from proxy(): each frame then fits Asio's recycling (see
  // send_continue), where one frame holding both did not. `client_request`: a decode leg's (see
  // request_accounting), when the client's request came.
  io::task<bool> exchange_and_relay(balancer::rank_lease lease, balancer::pick_context& request,
                                    balancer::request_cost cost, bool head_request, bool client_keep_alive,
                                    std::optional<clock_type::time_point> client_request = std::nullopt) {
    const auto watching = watch_leg();
    auto& watch = watch_;
    request_accounting accounting(shared_, std::move(lease), access_.open_entry(), client_request);
    accounting.speak_for(tenant_);
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
      // Nothing reached the engine's application and nothing reached the client: try another rank.
      if (attempt.retry_elsewhere && retries < settings_.max_retries && !request.pinned_rank) {
        if (accounting.move_elsewhere(request, cost, tried)) continue;
        const bool moved = co_await accounting.wait_elsewhere(client_, request, cost, ticket_, *watch);
        if (moved) continue;
        if (watch->client_gone) {
          accounting.finish(499);
          co_return false;
        }
      }
      co_return co_await fail_before_response(accounting, attempt.ec, attempt.kind, client_keep_alive);
    }
    accounting.answered(exchange.response_head().status);
    release_large_body();  // the engine has answered: nothing will be retried
    co_return co_await relay_answer(exchange, accounting, head_request, client_keep_alive);
  }

  // Relays the engine's answer, whose head `exchange` has read, to the client. Returns whether the client
  // connection may carry another request.
  io::task<bool> relay_answer(upstream_exchange& exchange, request_accounting& accounting, bool head_request,
                              bool client_keep_alive) {
    const unsigned client_version = replies_.client_version();
    const auto& watch = watch_;
    const std::size_t rank = accounting.rank();
    response_relay relay(client_.socket(), client_deadline_, exchange, settings_, client_framing_);
    relay.answer_request_id(request_ids_.client);  // an engine's echo of its id is the client's own again
    // A drain that began while the engine worked closes the connection after this response: say so.
    const bool keep_client = relay.prepare_head(rank, head_request, client_version,
                                                client_keep_alive && !shared_.draining.load(std::memory_order_relaxed));
    const auto relayed = co_await relay.run(accounting);
    access_.entry().bytes = relay.body_bytes();
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

  // What the balancer needs to know of the request, into `request` and `cost`: its pinned rank, its cluster
  // (from the body's model, with clusters that list models) and, for a policy that weighs them, its tokens
  // and prefix. The body is read only when something depends on it. A request that cannot be placed gets
  // false, with the reason in refusal_. A plain function, so that the body's facts are not part of
  // proxy()'s frame.
  bool describe_request(std::optional<std::int64_t> pinned, balancer::pick_context& request,
                        balancer::request_cost& cost) {
    const auto rank_count = shared_.topology.ranks().size();
    if (pinned) {
      if (*pinned < 0 || static_cast<std::uint64_t>(*pinned) >= rank_count) {
        refusal_ = {400, "X-data-parallel-rank " + std::to_string(*pinned) +
                             " is out of range: dplb serves ranks 0.." + std::to_string(rank_count - 1)};
        return false;
      }
      request.pinned_rank = static_cast<std::size_t>(*pinned);
    }
    const auto& models = shared_.models;
    request.cluster = models.default_cluster();
    if (request.pinned_rank) request.cluster = shared_.topology.ranks()[*request.pinned_rank].cluster;
    priority_ = 0;
    tenant_tokens_ = 0;
    // The queue orders by the body's priority and, fair by tokens, by its tokens; a token budget reserves them;
    // a min_priority raises the priority.
    const bool tenant_reads = shared_.balancer.queueing() ||
                              (tenant_ && (tenant_.tenant().has_token_budget() || tenant_.tenant().has_min_priority()));
    if (models.by_model() || reads_.body_for_any() || tenant_reads) {
      auto facts = inspect_request_body(request_body_, reads_.prefix_chain());
      priority_ = facts.priority.value_or(0);
      if (tenant_ && tenant_.tenant().has_min_priority() && !apply_min_priority(facts)) return false;
      if (access_.is_open()) access_.entry().model = facts.model;
      if (models.by_model() && !facts.model.empty()) {
        const auto served = models.cluster_of(facts.model);
        // As vLLM answers a model it does not serve.
        if (!served) {
          refusal_ = {404, "The model `" + facts.model + "` does not exist.", "model"};
          return false;
        }
        // (A pinned prefill rank serves its disaggregated cluster's models, in one leg.)
        const auto& pinned_pool = settings_.clusters[request.cluster];
        const auto home = pinned_pool.role == config::rank_role::prefill ? pinned_pool.decode_pool : request.cluster;
        if (request.pinned_rank && *served != home) {
          refusal_ = {400, "X-data-parallel-rank " + std::to_string(*request.pinned_rank) +
                               " is not a rank of the cluster serving `" + facts.model + "`"};
          return false;
        }
        if (!request.pinned_rank) request.cluster = *served;
      }
      if (tenant_reads) tenant_tokens_ = tenant_reservation(facts, request.cluster);
      if (reads_.body_for(request.cluster)) {
        cost = cost_of(facts, request);
      } else if (tenant_reads) {
        request.prompt_tokens = facts.prompt_tokens;  // the queue spreads long prompts (--long-prompt-tokens)
      }
    }
    request.session_key = session_key_;
    return true;
  }

  // In a disaggregated cluster kv_transfer_params are dplb's to write, never a client's: on a prefill engine they
  // hold the prompt's blocks for a pull that may never come, on a decode engine they pull blocks from whatever
  // host they name. A body that carries its own is refused on every path (two legs, a skipped prefill, a pinned
  // rank of either pool, any other path), before any engine or the tenant's budget sees it.
  bool leaves_kv_params_to_dplb(const balancer::pick_context& request) {
    if (settings_.clusters[request.cluster].role == config::rank_role::both) return true;
    if (!pd::sets_kv_transfer_params(request_body_)) return true;
    refusal_ = {400,
                "kv_transfer_params is set by dplb in a disaggregated (prefill/decode) cluster: a request may not "
                "carry its own (a body in UTF-16 or UTF-32, which dplb cannot check for it, is refused too)",
                "kv_transfer_params"};
    return false;
  }

  // What the request costs in tokens, from its body (for a policy that asks): the prompt, and the most it
  // may generate (max_tokens, else --default-max-tokens, times n). A separate function, so that the facts
  // are not part of proxy()'s coroutine frame.
  balancer::request_cost cost_of(request_facts& facts, balancer::pick_context& request) {
    const balancer::request_cost cost{facts.prompt_tokens,
                                      static_cast<std::uint32_t>(std::min<std::uint64_t>(most_generated(facts), UINT32_MAX))};
    request.prompt_tokens = cost.prompt;
    request.decode_tokens = cost.decode;
    // Kept by the session: the pick may wait in the queue, and the chain must live as long.
    prefix_chain_ = std::move(facts.prefix_chain);
    request.prefix_chain = prefix_chain_;
    kv_.prepare(facts, shared_, request, reads_.kv_events_for(request.cluster));
    return cost;
  }

  // The most tokens a request may generate: max_tokens (else --default-max-tokens) in each of its n choices.
  std::uint64_t most_generated(const request_facts& facts) const {
    return std::uint64_t{facts.max_tokens.value_or(settings_.default_max_tokens)} * std::max<std::uint32_t>(1, facts.choices);
  }

  // A tenant's min_priority raises the request's priority, in dplb's queue and in the body the engine gets
  // (body_with_priority); false, with the refusal in refusal_, for a body whose priority cannot be rewritten.
  bool apply_min_priority(const request_facts& facts) {
    priority_ = tenant_.tenant().allowed_priority(priority_);
    auto next = body_with_priority(request_body_, facts, priority_);
    if (next.result == priority_body::outcome::unusable) {
      refusal_ = {400, "the body's \"priority\" cannot be set to its tenant's min_priority: the body nests too deep "
                       "or holds numbers dplb cannot write back",
                  "priority"};
      return false;
    }
    if (next.result == priority_body::outcome::rewritten) {
      request_body_ = std::move(next.body);
      body_bytes_.set(request_body_.capacity());
    }
    return true;
  }

  // What the request reserves from its tenant's token budget (and weighs with "fair_by": "tokens"): its prompt
  // and the most it may generate. Without max_tokens, under a budget, that is the rest of its model's context
  // (max_model_len from the engines' /v1/models, less the prompt, in each of its n choices; while that is
  // unknown, --default-max-tokens), at most the whole budget: it is charged what it streams.
  std::uint64_t tenant_reservation(const request_facts& facts, std::size_t cluster) {
    const std::uint64_t prompt = facts.prompt_tokens;
    tenant_.note_prompt(prompt);
    if (facts.max_tokens || !tenant_ || !tenant_.tenant().has_token_budget()) return prompt + most_generated(facts);
    std::uint64_t each = settings_.default_max_tokens;
    if (shared_.model_context) {
      if (const auto context = shared_.model_context->max_model_len(cluster, facts.model)) {
        each = std::min<std::uint64_t>(*context > prompt ? *context - prompt : 0, UINT32_MAX);  // an engine's figure
      }
    }
    return tenant_.tenant().unbounded_reservation(prompt, each * std::max<std::uint32_t>(1, facts.choices));
  }

  // The request's tenant: a configured key's, else the keyless one --tenant-header names, else default.
  void identify_tenant(const http::request_head& head) {
    const auto named = settings_.tenant_header.empty() ? std::string_view{} : head.fields.value(settings_.tenant_header);
    auto who = shared_.tenants.identify(head.fields.value(bhttp::field::authorization), named);
    known_key_ = who.known_key;
    tenant_.begin(std::move(who.tenant));
    if (access_.is_open()) access_.entry().tenant = tenant_.tenant().name();
  }

  // The tenant's request rate and token budget (which reserves the request's tokens), over all replicas with
  // --shared-state; false, with the refusal in refusal_, when either says no.
  io::task<bool> admit_by_tenant() {
    const auto executor = client_.get_executor();  // a named value, not a temporary, across co_await
    const auto verdict = co_await admit_by_tenant_limits(executor, shared_, tenant_, tenant_tokens_);
    if (verdict.admitted()) co_return true;
    refusal_ = {429, tenant_refusal_text(verdict, tenant_.tenant().name())};
    refusal_.retry_after = verdict.retry_after_seconds;
    if (verdict.why == tenants::verdict::refusal::larger_than_budget) {
      refusal_.status = 400;  // no wait would ever let it through: not a 429 to retry
      refusal_.code = request_too_large_code;
    }
    co_return false;
  }

  // The client's answer when the request got no response from an engine. A request that reached no engine
  // (every connection attempt failed, the last one on this rank) gets 503 with Retry-After, as from
  // HAProxy or Envoy: nothing was sent anywhere, and trying again later is safe. An engine that took the
  // request and said nothing in time gives 504; one that failed while answering, 502. The slot is free
  // before the answer leaves: a client that saw the error also sees the slot free.
  io::task<bool> fail_before_response(request_accounting& accounting, const boost::system::error_code& ec,
                                      std::string_view kind, bool client_keep_alive) {
    const auto answer = answer_for_failure(accounting.rank(), shared_.topology.ranks()[accounting.rank()].name, ec, kind);
    if (!answer.not_delivered) tenant_.reached_engine();  // the engine took the request: its tokens count as reserved
    accounting.finish(answer.status);
    spdlog::warn("{}", answer.message);
    co_return co_await replies_.send_error(answer.status, answer.message, client_keep_alive, answer.not_delivered ? 1 : 0);
  }

  worker_state& worker_;
  shared_state& shared_;
  const config::settings& settings_;
  io::tcp_stream client_;  // its own timer is never armed: client_deadline_ keeps the deadlines
  io::read_buffer buffer_;  // holds a block only while a request is read (io_buffers.hpp)
  socket_deadline client_deadline_;    // guards the client's socket
  socket_deadline upstream_deadline_;  // guards the engine connection the request in progress uses
  std::string client_address_;
  access_record access_;  // --access-log's entry for the request being served
  tenant_pass tenant_;     // the request's standing with its tenant (before replies_, which counts on it)
  bool known_key_ = false;         // the request presented a configured API key
  std::int64_t priority_ = 0;      // its body's "priority" (0 when it has none)
  std::uint64_t tenant_tokens_ = 0;  // its prompt and most generated tokens, when its tenant reckons tokens
  queue_ticket ticket_;              // its place in dplb's queue, while it waits there (a member: see send_continue)
  own_replies replies_;    // what dplb answers itself
  // Why the request in progress gets no rank, when it gets none (describe_request, proxy): a member, not a
  // local, to keep it out of proxy()'s coroutine frame.
  struct no_rank_reason {
    unsigned status = 0;
    std::string message;
    std::string_view param = {};  // the body field at fault, for the error's "param"
    std::int64_t retry_after = 0;  // seconds, for a Retry-After header; 0: none
    std::string_view code = {};    // the error's string code, if it has one (else its status)
  } refusal_;
  std::shared_ptr<client_watch> watch_;  // of the request being proxied, made once per connection
  std::size_t idle_slot_ = idle_client_set::not_member;  // in worker_.idle_clients while waiting for a head
  bool releasing_ = false;  // release_when_idle cancelled the head read
  char idle_probe_ = 0;     // where the idle wait's MSG_PEEK copies a byte (never read)
  // Reused by every request of the connection, so that the steady state allocates nothing:
  http::request_head request_head_;    // views into buffer_
  std::string session_key_;            // --affinity-header's value in the request being served
  request_ids request_ids_;            // its X-Request-Id: the client's, and the engines'
  clock_type::time_point request_started_;  // when the request being proxied was read whole
  std::vector<std::uint64_t> prefix_chain_;  // its prompt's prefix blocks (prefix-aware), for the pick
  kv_request kv_;  // its prompt as the KV-cache events see it (prefix-aware with events), for the pick
  const pick_inputs& reads_ = shared_.reads;  // what the picks read of a request's body
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
