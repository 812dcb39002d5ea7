#pragma once
// Private to the session: a completion of a disaggregated cluster, in two legs. The prefill leg runs first, on
// a rank of the cluster's prefill pool (prefill_leg.hpp), and its kv_transfer_params go into the decode leg's
// body; the decode rank is picked when the prefill answers, as vLLM's own disaggregated proxy picks it, so that a
// decode rank's count is the requests it decodes (a lockstep decode pool's batches are what is balanced) and no
// decode slot is held while a request waits for, or runs, its prefill. Both legs carry one X-Request-Id (the
// session's, request_id.hpp). The prefill leg is skipped for a prompt the decode rank picked on arrival holds
// already. A client that leaves during the prefill leg has that engine connection closed, and no decode leg
// runs. What any request does is left to the session (run() says which): the decode leg goes its one-leg way,
// and so does a prefill answer relayed as it came, or a prefill failure answered.

#include <boost/beast/http/verb.hpp>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "dplb/http/message_head.hpp"
#include "dplb/server/admission.hpp"
#include "dplb/support/io_buffers.hpp"
#include "access_record.hpp"
#include "client_watch.hpp"
#include "kv_request.hpp"
#include "own_replies.hpp"
#include "prefill_leg.hpp"
#include "slot_wait.hpp"
#include "tenant_pass.hpp"

namespace dplb::server {

// The session's parts a two-leg request works with, one struct made for each such request: its worker, the
// client's connection and its deadline, the engine connection's deadline, the client watch; the request's access
// log entry, tenant and dplb's answers; its heads and body (rewritten for each leg; the engines' head carries the
// request's one X-Request-Id, request_id.hpp); its place in the queues (`ticket`, written from its `priority` and
// tenant `tokens`).
struct two_leg_parts {
  worker_state& worker;
  io::tcp_stream& client;
  socket_deadline& client_deadline;
  socket_deadline& upstream_deadline;
  std::shared_ptr<client_watch>& watch;
  access_record& access;
  tenant_pass& tenant;
  own_replies& replies;
  http::response_head& response_head;  // the engine's answer's
  upstream_head& engine_head;  // the engines' request head
  std::string& body;
  io::tracked_bytes& body_bytes;
  queue_ticket& ticket;
  std::int64_t priority = 0;
  std::uint64_t tokens = 0;
};

class two_leg_request {
 public:
  // What the session does once run() is over.
  enum class next {
    answered,        // the client has dplb's answer, or left: keep_alive() says whether the connection stays
    decode_leg,      // the request, its body and head now the decode leg's, goes to the decode rank
    relay_prefill,   // the prefill rank's answer is the client's as it came: prefill()'s exchange and accounting
    prefill_failed,  // no usable answer from any prefill rank: prefill().failure() says why
  };

  explicit two_leg_request(const two_leg_parts& parts) : parts_(parts), shared_(parts.worker.shared) {}
  two_leg_request(const two_leg_request&) = delete;
  two_leg_request& operator=(const two_leg_request&) = delete;

  // Whether the prefill leg was skipped (the decode rank holds the prompt): the decode rank prefills the rest.
  bool prefill_skipped() const noexcept { return skipped_; }

  // The request up to its decode leg. `request` and `cost`: the decode leg's pick and cost. After
  // next::decode_leg, decode_lease() is the decode rank's slot.
  io::task<next> run(const balancer::pick_context& request, balancer::request_cost cost, bool client_keep_alive) {
    const auto& settings = shared_.settings;
    // Both queues order it alike, and count it as its tenant's (max_queued).
    parts_.ticket = ticket_for(parts_.tenant, parts_.priority, parts_.tokens, settings);
    const double skip_ratio = settings.pd_skip_prefill_ratio;
    if (shared_.reads.may_skip_prefill(request.cluster) && kv_request::some_rank_holds(skip_ratio, request, shared_)) {
      // Some decode rank's KV-cache events say it holds the prompt: the request's decode rank is picked now, as
      // for any request, and if it is such a rank it computes the rest itself (the prefill leg, a transfer of
      // blocks it already has, is skipped). Else the request goes on in two legs, its decode rank picked anew
      // when the prefill answers.
      if (!co_await take_decode_slot(request, cost, client_keep_alive)) co_return next::answered;
      if (kv_request::share_held_by(decode_.rank(), request, shared_) >= skip_ratio) {
        shared_.metrics.prefill_skipped();
        skipped_ = true;
        parts_.tenant.holding_slot();
        co_return next::decode_leg;
      }
      decode_.release();
    }
    prefill_body_ = pd::prefill_body(parts_.body);
    if (!prefill_body_) {
      shared_.metrics.rejected(400);
      keep_alive_ = co_await parts_.replies.send_error(
          400, "the request body must be a JSON object: dplb writes the prefill leg's body from it", client_keep_alive);
      co_return next::answered;
    }
    if (!parts_.watch) parts_.watch = std::make_shared<client_watch>();
    auto& leg = leg_.emplace(parts_.worker, *parts_.watch, parts_.response_head, parts_.upstream_deadline, request, cost);
    const auto refusal = co_await leg.acquire(parts_.client, parts_.access.open_entry(), parts_.ticket);
    if (refusal != slot_refusal::none) {
      parts_.tenant.give_back_reservation();  // no engine saw it
      shared_.metrics.rejected(refusal == slot_refusal::client_gone ? 499 : refusal_status(refusal));
      if (refusal == slot_refusal::client_gone) {
        parts_.tenant.answered(499);
        if (parts_.access.is_open()) parts_.access.answered_by_dplb(499, 0);
        co_return next::answered;
      }
      keep_alive_ =
          co_await parts_.replies.send_error(refusal_status(refusal), leg.refusal_text(refusal), client_keep_alive, 1);
      co_return next::answered;
    }
    parts_.tenant.holding_slot();
    // The leg's client watch (the session's watch_leg()), while the prefill rank works and its answer is read.
    watching_.emplace(parts_.client_deadline, parts_.client.socket(), parts_.watch, parts_.worker.deadlines.period());
    set_upstream_framing(parts_.engine_head, boost::beast::http::verb::post, prefill_body_->size());
    const auto result = co_await leg.run(parts_.engine_head, *prefill_body_);
    if (parts_.access.is_open()) {
      auto& entry = parts_.access.entry();
      entry.prefill_rank = leg.accounting().rank();
      entry.prefill_status = leg.accounting().status();
      if (const auto took = leg.took()) entry.prefill_duration = std::chrono::duration<double>(*took).count();
    }
    switch (result) {
      case prefill_leg::result::client_gone:  // counted on its prefill rank (499)
        parts_.tenant.answered(499);
        co_return next::answered;
      case prefill_leg::result::failed:
        if (leg.answered_without_params()) {
          if (parts_.access.is_open()) parts_.access.entry().forget_rank_outcome();  // the client gets dplb's 502
          keep_alive_ = co_await parts_.replies.send_error(502, leg.missing_params_text(), client_keep_alive);
          co_return next::answered;
        }
        co_return next::prefill_failed;
      case prefill_leg::result::relay_answer:
        // A 4xx (or any answer but a 200) is the client's as the engine gave it; no decode leg runs.
        leg.accounting().speak_for(parts_.tenant);
        co_return next::relay_prefill;
      case prefill_leg::result::params_ready:
        break;
    }
    shared_.metrics.prefill_leg(*leg.took());
    // The client's body, braced (prefill_body() accepted it), with the prefill's params: it cannot fail.
    parts_.body = pd::decode_body(parts_.body, leg.params()).value();
    parts_.body_bytes.set(parts_.body.capacity());
    end_prefill_leg();
    // The decode leg's accounting fills the access log entry anew: the prefill leg's stays in its own fields.
    if (parts_.access.is_open()) parts_.access.entry().forget_rank_outcome();
    // A client that left during the prefill leg's last moments (before its watch began, or with its close
    // not yet seen): no decode leg starts for it.
    if (parts_.watch->client_gone || client_closed_now(parts_.client.socket())) {
      left_between_legs();
      co_return next::answered;
    }
    // The decode rank is bound now, as the prefill answers: a decode rank's count is what it decodes, and no
    // decode slot waits on a prefill (a wait for one here watches the client as any queued request's does).
    if (!co_await take_decode_slot(request, cost, client_keep_alive)) co_return next::answered;
    set_upstream_framing(parts_.engine_head, boost::beast::http::verb::post, parts_.body.size());
    co_return next::decode_leg;
  }

  // After next::decode_leg: the decode rank's slot, for the decode leg's accounting.
  balancer::rank_lease take_decode_lease() noexcept { return std::move(decode_); }

  // After next::answered: whether the client connection may carry another request.
  bool keep_alive() const noexcept { return keep_alive_; }
  // After next::relay_prefill or next::prefill_failed: the prefill leg, its watch still on until the request ends.
  prefill_leg& prefill() noexcept { return *leg_; }

 private:
  // The decode rank's slot, at once or after a wait in the decode ranks' queue (--max-inflight-per-rank), into
  // decode_. False when there is none: the client has dplb's answer (or left, counted as 499 between the legs).
  io::task<bool> take_decode_slot(const balancer::pick_context& request, balancer::request_cost cost,
                                  bool client_keep_alive) {
    auto slot = slot_without_queue(shared_, request, cost);
    if (!slot) slot = co_await wait_for_slot(parts_.client, shared_, request, cost, parts_.ticket);
    if (slot->lease) {
      decode_ = std::move(slot->lease);
      co_return true;
    }
    if (slot->refusal == slot_refusal::client_gone) {
      left_between_legs();
      co_return false;
    }
    parts_.tenant.give_back_reservation();  // no engine took the work for the client (a prefill's blocks are left)
    const auto status = refusal_status(slot->refusal);
    shared_.metrics.rejected(status);
    keep_alive_ = co_await parts_.replies.send_error(
        status, "no decode rank for the request: " + refusal_message(slot->refusal, request, shared_.models.by_model()),
        client_keep_alive, 1);
    co_return false;
  }

  // The client left while no leg ran (its decode leg not begun): counted, as nginx counts a client that closes
  // first (499), among the requests dplb answered without a rank.
  void left_between_legs() {
    shared_.metrics.rejected(499);
    parts_.tenant.answered(499);
    if (parts_.access.is_open()) parts_.access.answered_by_dplb(499, 0);
  }

  // The prefill leg's parts go before the decode leg starts, in the order the end of one scope holding them
  // would end them: the client watch, the leg (its engine connection and accounting), the prefill body.
  void end_prefill_leg() {
    watching_.reset();
    leg_.reset();
    prefill_body_.reset();
  }

  two_leg_parts parts_;  // the session's, for this request
  shared_state& shared_;
  bool keep_alive_ = false;
  bool skipped_ = false;
  balancer::rank_lease decode_;  // the decode rank's slot, from its pick to the decode leg's accounting
  // Declared in the order the prefill leg makes them, so that they also end in reverse (see end_prefill_leg).
  std::optional<std::string> prefill_body_;
  std::optional<prefill_leg> leg_;
  std::optional<leg_watch> watching_;
};

}  // namespace dplb::server
