#pragma once
// Private to the session: what a proxied request counts, and when. The request holds a slot on its rank
// (the lease) from the pick until the engine has finished with it; its outcome is counted once, under its
// final status; each failed attempt counts against its rank's errors and health. One object per request
// with an explicit state, instead of flags that every exit path had to keep in agreement.

#include <boost/beast/core/error.hpp>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <optional>
#include <string>
#include <vector>
#include <string_view>
#include <utility>

#include "dplb/balancer/balancer.hpp"
#include "dplb/metrics/access_log.hpp"
#include "dplb/metrics/proxy_metrics.hpp"
#include "dplb/metrics/usage_scanner.hpp"
#include "dplb/server/proxy_context.hpp"
#include "dplb/upstream/health_monitor.hpp"
#include "dplb/support/io_types.hpp"
#include "client_watch.hpp"
#include "slot_wait.hpp"
#include "tenant_pass.hpp"

namespace dplb::server {

// What the client is told when no engine answered, its last attempt (on `rank`) having failed as `ec`, of
// `kind` (metrics::upstream_error_kinds): 503 when it could not connect (nothing was delivered: trying again
// later is safe), 504 when the engine stayed silent, else 502; the message names the rank and what to check.
struct failure_answer {
  unsigned status = 502;
  bool not_delivered = false;
  std::string message;
};
inline failure_answer answer_for_failure(std::size_t rank, std::string_view rank_name, const boost::system::error_code& ec,
                                         std::string_view kind) {
  const bool timeout = ec == boost::beast::error::timeout;
  failure_answer answer;
  answer.not_delivered = kind == "connect";
  answer.status = answer.not_delivered ? 503 : timeout ? 504 : 502;
  const auto where = "backend rank " + std::to_string(rank) + " (" + std::string(rank_name) + ")";
  answer.message =
      answer.not_delivered
          ? "no backend rank could take the request; the last tried, " + where +
                (timeout ? ", did not accept a connection within --upstream-connect-timeout-ms"
                         : ", refused the connection: " + ec.message())
      : answer.status == 504 ? where + " did not answer in time (--upstream-first-byte-timeout-ms, --upstream-read-timeout-ms)"
                             : "dplb could not get a response from " + where + ": " + std::string(kind) + ": " + ec.message();
  return answer;
}

class request_accounting {
 public:
  using clock_type = std::chrono::steady_clock;

  enum class state {
    waiting,    // a rank is picked; no final response head from it yet
    answered,   // the engine's final head arrived: its status is known, its body is on the way
    finished,   // counted under its final status; the slot is free
  };

  // `access`: the request's access log entry, filled as the metrics are (null without --access-log).
  // `client_request`: for the decode leg of a disaggregated request, when the client's request came: its
  // time to first byte and duration are measured from there, whatever decode rank ends up serving it (the
  // client's, prefill leg included), and the leg's own time, from now, goes to dplb_pd_leg_duration_seconds.
  request_accounting(shared_state& shared, balancer::rank_lease lease, metrics::access_entry* access,
                     std::optional<clock_type::time_point> client_request = std::nullopt)
      : shared_(shared), lease_(std::move(lease)), rank_(lease_.rank()), leg_sent_at_(clock_type::now()),
        picked_at_(client_request.value_or(leg_sent_at_)), decode_leg_(client_request.has_value()), access_(access) {}

  // The request's answer to the client is this accounting's (its main leg's, or a prefill leg's that is
  // relayed): its tenant counts it with its status and tokens.
  void speak_for(tenant_pass& tenant) noexcept {
    tenant_ = &tenant;
    if (state_ != state::waiting) tenant.reached_engine();  // a prefill answer relayed: its engine did the work
  }

  std::size_t rank() const noexcept { return rank_; }
  state current() const noexcept { return state_; }
  unsigned status() const noexcept { return status_; }

  // The request goes on to another rank after its rank failed before answering.
  void move_to(balancer::rank_lease next) {
    lease_ = std::move(next);
    rank_ = lease_.rank();
    if (!decode_leg_) picked_at_ = clock_type::now();
    shared_.metrics.retried();
  }

  // After an attempt that failed before the engine took the request: the request moves to another rank of
  // its cluster, none behind the failed rank's URL (they share its server); false when no rank is left.
  // `tried` holds the ranks ruled out so far (sized on the first retry: the usual request never needs it).
  bool move_elsewhere(balancer::pick_context& request, balancer::request_cost cost, std::vector<bool>& tried) {
    const auto ranks = shared_.topology.ranks();
    const auto& failed = shared_.topology.backends()[ranks[rank_].backend];
    tried.resize(ranks.size());
    std::fill_n(tried.begin() + static_cast<std::ptrdiff_t>(failed.first_rank), failed.dp, true);
    request.avoid = &tried;
    auto next = shared_.balancer.acquire(request, cost);
    if (!next) return false;
    spdlog::debug("rank {} failed; retrying on rank {}", rank_, next.rank());
    move_to(std::move(next));
    return true;
  }

  // After move_elsewhere() found every untried rank full (--max-inflight-per-rank): the request waits for a
  // slot on one of them, before every waiter (it had its turn), for up to --queue-timeout-ms, while its
  // client stays (`leg`: the watch of the leg that failed tells). The failed rank's slot is given back first
  // (its rank stays named for the outcome, should no slot come): two retries must not each hold the slot the
  // other waits for. `ticket`: the request's own (its priority and tenant). False: no slot (no queueing, the
  // client left, the wait timed out, no untried rank is usable).
  io::task<bool> wait_elsewhere(io::tcp_stream& client, const balancer::pick_context& request,
                                balancer::request_cost cost, queue_ticket ticket, client_watch& leg) {
    if (!shared_.balancer.queueing()) co_return false;
    lease_.release();
    ticket.share.retry = true;
    ticket.max_wait = {};  // no 429 for a request an engine failed: a wait that ends without a slot (at
                           // --queue-timeout-ms at most) answers the failed attempt's 502, or 503 after a refusal
    auto slot = co_await wait_for_slot(client, shared_, request, cost, ticket, &leg);
    if (!slot.lease) co_return false;
    move_to(std::move(slot.lease));
    co_return true;
  }

  // An attempt on the rank failed (`kind`: one of metrics::upstream_error_kinds).
  void attempt_failed(std::string_view kind, upstream::request_outcome outcome) {
    shared_.metrics.upstream_error(rank_, kind);
    shared_.health.record(rank_, outcome);
  }

  // The engine's final response head: its time to first byte, and its verdict on the rank's health. A 5xx
  // is relayed as it is (the engine's message is the useful one), but counts against the rank.
  void answered(unsigned status) {
    state_ = state::answered;
    status_ = status;
    if (tenant_) tenant_->reached_engine();
    const auto first_byte = clock_type::now() - picked_at_;
    shared_.metrics.first_byte(rank_, first_byte);
    if (access_) access_->ttfb = std::chrono::duration<double>(first_byte).count();
    if (status >= 500) {
      attempt_failed("server_error", upstream::request_outcome::server_error);
    } else {
      shared_.health.record(rank_, upstream::request_outcome::success);
    }
  }

  // Body bytes came from the engine: its first token at the latest, so the prompt is prefilled. (Not the
  // head: a streaming vLLM sends its head before the prefill starts.) Only the first call does anything.
  void body_arrived() noexcept { lease_.prompt_done(); }

  // Whether the request's tenant reckons its tokens: then the relay counts a stream's events for it.
  bool reckons_tokens() const noexcept { return tenant_ && tenant_->reckons_tokens(); }
  // The stream's events counted so far (usage_scanner::stream_events): the tenant's charge should the
  // stream end without a usage report, or be cut short.
  void streamed(const metrics::usage_scanner& usage) noexcept {
    if (tenant_) tenant_->streamed(usage.stream_events());
  }

  // The engine has sent its whole response. The slot is given back at once (from now on the request costs
  // the engine nothing) and the request is counted, with the tokens its usage reported, before the client
  // has the last bytes: a client that has seen the end of its response also sees the metrics with it.
  void engine_finished(const metrics::usage_scanner& usage) {
    if (state_ == state::finished) return;
    const bool counts_tokens = status_ == 200 && (usage.prompt_tokens() || usage.completion_tokens());
    if (counts_tokens) {
      shared_.metrics.tokens(rank_, usage.prompt_tokens().value_or(0), usage.completion_tokens().value_or(0));
      if (tenant_) tenant_->used(usage.prompt_tokens().value_or(0), usage.completion_tokens().value_or(0));
      if (access_) {
        access_->prompt_tokens = usage.prompt_tokens();
        access_->completion_tokens = usage.completion_tokens();
      }
    } else if (tenant_) {
      tenant_->streamed(usage.stream_events());
      tenant_->settle_streamed();  // a stream without usage: charged what it streamed
    }
    finish(status_);
  }

  // Ends the request under `status`, unless it was counted already: the answer dplb gave on the rank's
  // behalf (502, 503, 504), the engine's own status for a response cut short, 499 for a client that left.
  void finish(unsigned status) {
    if (std::exchange(state_, state::finished) == state::finished) return;
    lease_.release();
    if (tenant_) tenant_->answered(status);
    const auto now = clock_type::now();
    const auto duration = now - picked_at_;
    shared_.metrics.request_finished(rank_, status, duration);
    if (decode_leg_) shared_.metrics.decode_leg(now - leg_sent_at_);
    if (access_) {
      access_->rank = rank_;
      access_->status = status;
      access_->duration = std::chrono::duration<double>(duration).count();
    }
  }

 private:
  shared_state& shared_;
  balancer::rank_lease lease_;
  std::size_t rank_;
  clock_type::time_point leg_sent_at_;
  clock_type::time_point picked_at_;  // where its times start: the pick, or (a decode leg) the client's request
  bool decode_leg_;
  state state_ = state::waiting;
  unsigned status_ = 0;
  metrics::access_entry* access_;
  tenant_pass* tenant_ = nullptr;
};

}  // namespace dplb::server
