#pragma once
// Private to the session: a completion of a disaggregated cluster, in two legs. The decode rank is the one
// picked when the request arrived (so a burst splits exactly over the decode ranks); the prefill leg runs
// first, on a rank of the cluster's prefill pool (prefill_leg.hpp), and its kv_transfer_params go into the
// decode leg's body. Both legs carry one X-Request-Id. The prefill leg is skipped for a prompt the decode
// rank holds already. A client that leaves during the prefill leg has that engine connection closed, and no
// decode leg runs. What any request does is left to the session (run() says which): the decode leg goes its
// one-leg way, and so does a prefill answer relayed as it came, or a prefill failure answered.

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

class two_leg_request {
 public:
  // What the session does once run() is over.
  enum class next {
    answered,        // the client has dplb's answer, or left: keep_alive() says whether the connection stays
    decode_leg,      // the request, its body and head now the decode leg's, goes to the decode rank
    relay_prefill,   // the prefill rank's answer is the client's as it came: prefill()'s exchange and accounting
    prefill_failed,  // no usable answer from any prefill rank: prefill().failure() says why
  };

  // The session's parts the request uses: its worker, the client's connection and its deadline, the engine
  // connection's deadline, the client watch; the request's access log entry, tenant and dplb's answers; its
  // heads and body (rewritten for each leg; the engines' head carries the request's one X-Request-Id, the
  // session's request_id.hpp), and its place in the queue (`ticket`, written
  // for the prefill queue from the request's priority and tenant tokens, as the decode queue had it).
  two_leg_request(worker_state& worker, io::tcp_stream& client, socket_deadline& client_deadline,
                  socket_deadline& upstream_deadline, std::shared_ptr<client_watch>& watch, access_record& access,
                  tenant_pass& tenant, own_replies& replies, http::response_head& response_head,
                  upstream_head& upstream_head, std::string& body, io::tracked_bytes& body_bytes,
                  queue_ticket& ticket, std::int64_t priority, std::uint64_t tokens)
      : worker_(worker), shared_(worker.shared), client_(client), client_deadline_(client_deadline),
        upstream_deadline_(upstream_deadline), watch_(watch), access_(access), tenant_(tenant), replies_(replies),
        response_head_(response_head), upstream_head_(upstream_head), body_(body), body_bytes_(body_bytes),
        ticket_(ticket), priority_(priority), tokens_(tokens) {}
  two_leg_request(const two_leg_request&) = delete;
  two_leg_request& operator=(const two_leg_request&) = delete;

  // Whether the prefill leg was skipped (the decode rank holds the prompt): the decode rank prefills the rest.
  bool prefill_skipped() const noexcept { return !leg_; }

  // The request up to its decode leg. `decode`: the decode rank's lease, released here when no decode leg
  // will run; `request` and `cost`: the decode leg's pick and cost.
  io::task<next> run(balancer::rank_lease& decode, const balancer::pick_context& request, balancer::request_cost cost,
                     bool client_keep_alive) {
    const auto& settings = shared_.settings;
    if (shared_.reads.may_skip_prefill(request.cluster) &&
        kv_request::share_held_by(decode.rank(), request, shared_) >= settings.pd_skip_prefill_ratio) {
      // The decode rank's KV-cache events say it holds the prompt: it computes the rest itself, and the
      // prefill leg (a transfer of blocks it already has) is skipped.
      shared_.metrics.prefill_skipped();
      co_return next::decode_leg;
    }
    prefill_body_ = pd::prefill_body(body_);
    if (!prefill_body_) {
      decode.release();  // free before the answer leaves, as every refusal's slot is
      shared_.metrics.rejected(400);
      keep_alive_ = co_await replies_.send_error(
          400, "the request body must be a JSON object: dplb writes the prefill leg's body from it", client_keep_alive);
      co_return next::answered;
    }
    if (!watch_) watch_ = std::make_shared<client_watch>();
    auto& leg = leg_.emplace(worker_, *watch_, response_head_, upstream_deadline_, request, cost);
    // The prefill queue orders it as the decode queue did, and counts it as its tenant's (max_queued).
    ticket_ = ticket_for(tenant_, priority_, tokens_, settings);
    if (const auto refusal = co_await leg.acquire(client_, access_.open_entry(), ticket_); refusal != slot_refusal::none) {
      decode.release();
      tenant_.give_back_reservation();  // no engine saw it
      shared_.metrics.rejected(refusal == slot_refusal::client_gone ? 499 : refusal_status(refusal));
      if (refusal == slot_refusal::client_gone) {
        tenant_.answered(499);
        if (access_.is_open()) access_.answered_by_dplb(499, 0);
        co_return next::answered;
      }
      keep_alive_ = co_await replies_.send_error(refusal_status(refusal), leg.refusal_text(refusal), client_keep_alive, 1);
      co_return next::answered;
    }
    // The leg's client watch (the session's watch_leg()), while the prefill rank works and its answer is read.
    watching_.emplace(client_deadline_, client_.socket(), watch_, worker_.deadlines.period());
    set_upstream_framing(upstream_head_, boost::beast::http::verb::post, prefill_body_->size());
    const auto result = co_await leg.run(upstream_head_, *prefill_body_);
    if (access_.is_open()) {
      auto& entry = access_.entry();
      entry.prefill_rank = leg.accounting().rank();
      entry.prefill_status = leg.accounting().status();
      if (const auto took = leg.took()) entry.prefill_duration = std::chrono::duration<double>(*took).count();
    }
    if (result != prefill_leg::result::params_ready) decode.release();  // no decode leg: the slot goes now
    switch (result) {
      case prefill_leg::result::client_gone:  // counted on its prefill rank (499)
        tenant_.answered(499);
        co_return next::answered;
      case prefill_leg::result::failed:
        if (leg.answered_without_params()) {
          if (access_.is_open()) access_.entry().forget_rank_outcome();  // the client gets dplb's 502
          keep_alive_ = co_await replies_.send_error(502, leg.missing_params_text(), client_keep_alive);
          co_return next::answered;
        }
        co_return next::prefill_failed;
      case prefill_leg::result::relay_answer:
        // A 4xx (or any answer but a 200) is the client's as the engine gave it; no decode leg runs.
        leg.accounting().speak_for(tenant_);
        co_return next::relay_prefill;
      case prefill_leg::result::params_ready:
        break;
    }
    shared_.metrics.prefill_leg(*leg.took());
    // The client's body, braced (prefill_body() accepted it), with the prefill's params: it cannot fail.
    body_ = pd::decode_body(body_, leg.params()).value();
    body_bytes_.set(body_.capacity());
    end_prefill_leg();
    // The decode leg's accounting fills the access log entry anew: the prefill leg's stays in its own fields.
    if (access_.is_open()) access_.entry().forget_rank_outcome();
    // A client that left during the prefill leg's last moments (before its watch began, or with its close
    // not yet seen): no decode leg starts for it.
    if (watch_->client_gone || client_closed_now(client_.socket())) {
      tenant_.answered(499);
      if (access_.is_open()) access_.answered_by_dplb(499, 0);
      co_return next::answered;
    }
    set_upstream_framing(upstream_head_, boost::beast::http::verb::post, body_.size());
    co_return next::decode_leg;
  }

  // After next::answered: whether the client connection may carry another request.
  bool keep_alive() const noexcept { return keep_alive_; }
  // After next::relay_prefill or next::prefill_failed: the prefill leg, its watch still on until the request ends.
  prefill_leg& prefill() noexcept { return *leg_; }

 private:
  // The prefill leg's parts go before the decode leg starts, in the order the end of one scope holding them
  // would end them: the client watch, the leg (its engine connection and accounting), the prefill body.
  void end_prefill_leg() {
    watching_.reset();
    leg_.reset();
    prefill_body_.reset();
  }

  worker_state& worker_;
  shared_state& shared_;
  io::tcp_stream& client_;
  socket_deadline& client_deadline_;
  socket_deadline& upstream_deadline_;
  std::shared_ptr<client_watch>& watch_;
  access_record& access_;
  tenant_pass& tenant_;
  own_replies& replies_;
  http::response_head& response_head_;
  upstream_head& upstream_head_;
  std::string& body_;
  io::tracked_bytes& body_bytes_;
  queue_ticket& ticket_;
  const std::int64_t priority_;
  const std::uint64_t tokens_;
  bool keep_alive_ = false;
  // Declared in the order the prefill leg makes them, so that they also end in reverse (see end_prefill_leg).
  std::optional<std::string> prefill_body_;
  std::optional<prefill_leg> leg_;
  std::optional<leg_watch> watching_;
};

}  // namespace dplb::server
