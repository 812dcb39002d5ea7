#pragma once
// Private to the session: a request's slot on a rank under --max-inflight-per-rank. It is taken at once, or
// after a wait in dplb's queue (its discipline is in balancer.hpp) bounded by --queue-timeout-ms, during
// which the client's departure gives the place up. A request that gets no slot is refused with a status
// and a message that say why.

#include <boost/asio/buffer.hpp>
#include <boost/asio/post.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "dplb/balancer/balancer.hpp"
#include "dplb/balancer/replica_ledger.hpp"
#include "dplb/server/proxy_context.hpp"
#include "dplb/support/io_types.hpp"
#include "client_watch.hpp"
#include "tenant_pass.hpp"

namespace dplb::server {

enum class slot_refusal { none, no_usable_rank, queue_full, tenant_queue_full, queue_timeout, queue_deadline, client_gone };

// What a request brings to dplb's queue besides its pick: its place in the order (its priority, its tenant
// and that tenant's share), the longest it may wait there (its tenant's max_queue_wait_ms, else
// --max-queue-wait-ms; 0: --queue-timeout-ms alone), and its tenant's standing, which counts it as queued
// while it waits (null: none).
struct queue_ticket {
  balancer::queue_share share;
  std::chrono::milliseconds max_wait{0};
  tenant_pass* tenant = nullptr;
};

struct slot_result {
  balancer::rank_lease lease;
  slot_refusal refusal = slot_refusal::none;
};

// The request's ticket: its priority, its tenant and that tenant's share (a request, or its tokens with
// "fair_by": "tokens"), its longest wait (the tenant's max_queue_wait_ms, else --max-queue-wait-ms).
inline queue_ticket ticket_for(tenant_pass& tenant, std::int64_t priority, std::uint64_t tokens,
                               const config::settings& settings) {
  queue_ticket ticket;
  ticket.share.priority = priority;
  if (!tenant) return ticket;
  const auto terms = tenant.tenant().terms();
  ticket.share.tenant = tenant.tenant().id();
  ticket.share.weight = terms.weight;
  ticket.share.max_queued = terms.max_queued;
  if (settings.fair_by == config::fair_basis::tokens) ticket.share.cost = std::max<std::uint64_t>(1, tokens);
  ticket.max_wait = terms.max_queue_wait.count() > 0 ? terms.max_queue_wait : settings.max_queue_wait;
  ticket.share.max_wait = ticket.max_wait;  // a waiter held for its place takes any rank before this runs out
  ticket.tenant = &tenant;
  return ticket;
}

// The waiter keeps `request`, with its views of the session's prefix chain and session key (and a retry's
// tried ranks): they stay put while the session is suspended here, and the balancer reads them only until it
// delivers a lease or cancel_wait() returns. Nothing else may be pending on the client's socket, unless
// `leg` is given: the watch of the leg a retry comes from, which then tells of the client's leaving.
// `through_ledger`: the shared ledger found every candidate full over all replicas; the request waits in the
// ledger's line (replica_ledger::wait: the limit counts every replica's requests), in the order of its
// priority, and in dplb's own queue only if the ledger stops answering meanwhile.
inline io::task<slot_result> wait_for_slot(io::tcp_stream& client, shared_state& shared,
                                           const balancer::pick_context& request, balancer::request_cost cost,
                                           const queue_ticket& ticket, client_watch* leg = nullptr,
                                           bool through_ledger = false) {
  namespace asio = boost::asio;
  using clock_type = std::chrono::steady_clock;
  struct wait_state {
    explicit wait_state(const io::executor& ex) : timer(ex) {}
    io::steady_timer timer;
    balancer::rank_lease lease;
    bool gave_up = false;
    bool waking = false;       // the wait is over: the client watch must not touch it any more
    bool client_gone = false;  // the client closed or reset its connection while queued
    bool turned_away = false;  // the balancer can never serve it (removed ranks)
    bool fell_back = false;    // the ledger stopped answering: wait in dplb's own queue
    char probe = 0;            // where the watch's MSG_PEEK copies a byte (nothing is consumed)
  };
  // The wait ends at --queue-timeout-ms (503), or sooner at the request's own limit (429: before any engine
  // has cost anything, the client is told to come back).
  const bool by_wait_limit = ticket.max_wait.count() > 0 && ticket.max_wait < shared.settings.queue_timeout;
  const auto queue_timeout = by_wait_limit ? ticket.max_wait : shared.settings.queue_timeout;
  auto executor = client.get_executor();
  auto state = std::make_shared<wait_state>(executor);
  // Runs on whichever thread freed the slot: it only hands the lease to this session's thread.
  auto deliver = [state, executor](balancer::rank_lease lease) {
    asio::post(executor, [state, lease = std::move(lease)]() mutable {
      if (state->gave_up) return;  // too late: the lease is released right here
      state->turned_away = !lease;  // its rank (or every rank of its cluster) was removed
      state->lease = std::move(lease);
      state->timer.cancel();
    });
  };
  std::uint64_t waiter_id = 0;
  if (through_ledger) {
    // Held weakly, as in slot_from_ledger: the ledger's waiters may outlive the workers at shutdown.
    auto weak = std::weak_ptr(state);
    waiter_id = shared.ledger->wait(request, cost, ticket.share.priority, [weak, executor](balancer::rank_lease lease) {
      if (weak.expired()) return;  // the session is gone: the lease is released right here
      asio::post(executor, [weak, lease = std::move(lease)]() mutable {
        const auto state = weak.lock();
        if (!state || state->gave_up) return;  // too late: the lease is released right here
        state->fell_back = !lease;
        state->lease = std::move(lease);
        state->timer.cancel();
      });
    });
    if (waiter_id == 0) co_return slot_result{{}, slot_refusal::queue_full};
  } else {
    auto outcome = shared.balancer.acquire_or_wait(request, cost, ticket.share, deliver);
    switch (outcome.state) {
      case balancer::wait_state::served: co_return slot_result{std::move(outcome.lease)};
      case balancer::wait_state::queued: break;
      // Refused at once: the queue (or the tenant's part of it) is full, or no rank (the pinned one, for a
      // pinned request) is usable.
      case balancer::wait_state::queue_full: co_return slot_result{{}, slot_refusal::queue_full};
      case balancer::wait_state::tenant_queue_full: co_return slot_result{{}, slot_refusal::tenant_queue_full};
      case balancer::wait_state::no_usable_rank: co_return slot_result{{}, slot_refusal::no_usable_rank};
    }
    waiter_id = outcome.waiter_id;
  }
  const auto give_up_place = [&shared, through_ledger](std::uint64_t id) {
    if (through_ledger) {
      shared.ledger->cancel(id);
    } else {
      shared.balancer.cancel_wait(id);
    }
  };
  const auto waiting_since = clock_type::now();
  if (ticket.tenant) ticket.tenant->set_queued(true);
  // Should the wait below throw (an allocation under the balancer's lock), the waiter must not outlive this
  // frame: the balancer would go on reading the views it keeps (prefix chain, tried ranks) and hand it a slot.
  struct leave_on_unwind {
    const decltype(give_up_place)& give_up;
    std::shared_ptr<wait_state>& state;
    std::uint64_t id;
    const queue_ticket& ticket;
    client_watch* leg;
    bool armed = true;
    ~leave_on_unwind() {
      if (!armed) return;
      if (leg) leg->queue_wait = nullptr;
      if (ticket.tenant) ticket.tenant->set_queued(false);
      state->gave_up = true;  // a lease already on its way is released where it lands
      try {
        give_up(id);
      } catch (...) {
      }
    }
  } unwind_guard{give_up_place, state, waiter_id, ticket, leg};
  // A waiter holding out for its own full rank stops after the balancer's placement_wait, and a long prompt
  // passing over ranks still prefilling one after its long_prompt_hold; no other event may come by then (no
  // release, no arrival), so it wakes itself at each to be served anew, then waits out its queue timeout.
  std::array<clock_type::duration, 2> wakes{};
  std::size_t wake_count = 0;
  const auto wake_at = [&](clock_type::duration after) {
    if (after.count() > 0 && after < queue_timeout) wakes[wake_count++] = after;
  };
  // (The ledger's line has no places to hold out for, nor long prompts to pass over.)
  if (!through_ledger && shared.balancer.spreads(request)) wake_at(shared.balancer.long_prompt_hold());
  if (!through_ledger) wake_at(shared.balancer.placement_wait(ticket.share));
  std::sort(wakes.begin(), wakes.begin() + static_cast<std::ptrdiff_t>(wake_count));
  std::size_t woken = 0;
  state->timer.expires_after(wake_count > 0 ? wakes[0] : clock_type::duration(queue_timeout));
  // A client that leaves while queued must give its place up at once: otherwise it holds up everyone
  // behind it and, once served, its request still reaches an engine. The watch is watch_client's
  // one-byte MSG_PEEK (client_watch.hpp); bytes arriving are a pipelined request, not a departure. A retry's
  // leg has that watch running already: it cancels the timer.
  if (leg) {
    leg->queue_wait = &state->timer;
  } else {
    client.socket().async_receive(asio::buffer(&state->probe, 1), io::socket::message_peek,
                                  [state](const boost::system::error_code& ec, std::size_t n) {
                                    if (state->waking || ec == asio::error::operation_aborted) return;
                                    if (!ec && n > 0) return;
                                    state->client_gone = true;
                                    state->timer.cancel();
                                  });
  }
  const auto client_gone = [&] { return leg ? leg->client_gone : state->client_gone; };
  for (;;) {
    if (client_gone()) break;  // (a retry's client may have left before its wait began)
    auto [wait_ec] = co_await state->timer.async_wait(io::as_result);
    if (wait_ec || woken == wake_count || state->lease || client_gone() || state->turned_away || state->fell_back) {
      break;
    }
    ++woken;
    state->timer.expires_at(waiting_since + (woken < wake_count ? wakes[woken] : clock_type::duration(queue_timeout)));
    shared.balancer.reconsider();  // may deliver to this waiter: the hand-over is posted, then cancels the timer
  }
  unwind_guard.armed = false;
  state->waking = true;
  state->client_gone = client_gone();
  if (leg) {
    leg->queue_wait = nullptr;
  } else {
    boost::system::error_code ignored;
    client.socket().cancel(ignored);  // ends the watch; nothing else is pending on the client socket
  }
  shared.metrics.queued(clock_type::now() - waiting_since, ticket.share.priority);
  if (ticket.tenant) ticket.tenant->set_queued(false);
  if (state->lease && !state->client_gone) co_return slot_result{std::move(state->lease)};
  state->gave_up = true;
  give_up_place(waiter_id);  // if it was served meanwhile, the posted lease is released
  if (state->fell_back && !state->client_gone) {
    co_return co_await wait_for_slot(client, shared, request, cost, ticket, leg);  // in dplb's own queue
  }
  state->lease.release();                  // served, but the client has left: the slot goes on
  co_return slot_result{{}, state->client_gone   ? slot_refusal::client_gone
                            : state->turned_away ? slot_refusal::no_usable_rank
                            : by_wait_limit      ? slot_refusal::queue_deadline
                                                 : slot_refusal::queue_timeout};
}

// Without --max-inflight-per-rank there is no queue: the slot is taken at once, without a coroutine of its
// own (the usual request's path). Nullopt when the caller must wait for one with wait_for_slot().
inline std::optional<slot_result> slot_without_queue(shared_state& shared, const balancer::pick_context& request,
                                                     balancer::request_cost cost) {
  if (shared.balancer.queueing()) return std::nullopt;
  auto lease = shared.balancer.acquire(request, cost);
  return slot_result{std::move(lease), slot_refusal::no_usable_rank};  // the refusal is read only without a lease
}

// What the client is told when a request got no slot (not for client_gone: nobody is left to tell).
// 429 when dplb's queue, or the tenant's part of it, is full, or the request waited as long as it may (retry
// later is the cure); 503 otherwise, with what to check.
inline unsigned refusal_status(slot_refusal refusal) {
  return refusal == slot_refusal::queue_full || refusal == slot_refusal::tenant_queue_full ||
                 refusal == slot_refusal::queue_deadline
             ? 429
             : 503;
}

inline std::string refusal_message(slot_refusal refusal, const balancer::pick_context& request, bool by_model) {
  switch (refusal) {
    case slot_refusal::queue_full:
      return "every rank is at --max-inflight-per-rank and dplb's queue is full; retry later";
    case slot_refusal::tenant_queue_full: return "this tenant has its most requests queued (max_queued); retry later";
    case slot_refusal::queue_timeout: return "no rank slot freed within --queue-timeout-ms; retry later";
    case slot_refusal::queue_deadline:
      return "no rank slot freed within the longest this request may wait in dplb's queue (its tenant's "
             "max_queue_wait_ms, else --max-queue-wait-ms); no engine saw it; retry later";
    default: break;
  }
  if (request.pinned_rank) {
    return "rank " + std::to_string(*request.pinned_rank) +
           " (named by X-data-parallel-rank) is not usable now (down, ejected, drained or removed); retry later";
  }
  return by_model ? "no rank of the cluster serving this request is usable; check its engines and their /health"
                  : "no backend rank is usable; check the engines and their /health";
}

}  // namespace dplb::server
