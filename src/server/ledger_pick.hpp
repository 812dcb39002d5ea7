#pragma once
// Private to the session: a pick made by the ledger dplb replicas share (--shared-state). The session waits
// for the ledger's answer without blocking its thread; the answer (a lease already counted in the balancer)
// is handed to the session's thread. The ledger answers every pick within --shared-state-timeout-ms, with
// a rank or without one (then the caller picks by its own counts); should its thread be gone, the session
// stops waiting a little later all the same, and a lease that lands after that is released where it lands.

#include <boost/asio/post.hpp>

#include <chrono>
#include <memory>
#include <optional>

#include "dplb/balancer/replica_ledger.hpp"
#include "dplb/server/proxy_context.hpp"
#include "dplb/support/io_types.hpp"
#include "slot_wait.hpp"

namespace dplb::server {

struct ledger_answer {
  std::optional<slot_result> slot;  // none: pick by the replica's own counts, unless `full`
  bool full = false;  // every candidate is at --max-inflight-per-rank over all replicas: wait for a slot
};

inline io::task<ledger_answer> slot_from_ledger(const io::executor& executor, shared_state& shared,
                                                const balancer::pick_context& request, balancer::request_cost cost) {
  using outcome = balancer::replica_ledger::pick_outcome;
  struct answer_state {
    explicit answer_state(const io::executor& ex) : timer(ex) {}
    io::steady_timer timer;
    balancer::rank_lease lease;
    outcome said = outcome::unanswered;
    bool answered = false;
    bool gave_up = false;
  };
  auto state = std::make_shared<answer_state>(executor);
  state->timer.expires_after(2 * shared.settings.shared_state_timeout + std::chrono::milliseconds(50));
  // The ledger holds the state weakly: at shutdown its pending callbacks outlive the workers, and the last
  // owner of the state (and of its timer, of a worker's loop) must be the session.
  shared.ledger->pick(request, cost, [weak = std::weak_ptr(state), executor](balancer::rank_lease lease, outcome said) {
    if (weak.expired()) return;  // the session is gone: the lease is released right here
    boost::asio::post(executor, [weak, said, lease = std::move(lease)]() mutable {
      const auto state = weak.lock();
      if (!state || state->gave_up) return;  // too late: the lease is released right here
      state->answered = true;
      state->said = said;
      state->lease = std::move(lease);
      state->timer.cancel();
    });
  });
  if (!state->answered) co_await state->timer.async_wait(io::as_result);
  ledger_answer answer;
  if (!state->answered) {
    state->gave_up = true;
    co_return answer;
  }
  answer.full = state->said == outcome::full;
  if (state->lease) answer.slot = slot_result{std::move(state->lease)};
  co_return answer;
}

// A request's slot: from the shared ledger when it picks the request, else by this replica's own counts;
// when none is free, after a wait in the ledger's line (every candidate full over all replicas) or in dplb's
// queue. `ticket` is set by make_ticket() only for a wait; the waiter keeps it, so it must outlive this.
// (Not a conditional expression around co_await: GCC 12 destroys its temporaries twice, a lease among them.)
template <class MakeTicket>
io::task<slot_result> take_slot(io::tcp_stream& client, shared_state& shared, const balancer::pick_context& request,
                                balancer::request_cost cost, queue_ticket& ticket, MakeTicket make_ticket) {
  std::optional<slot_result> slot;
  bool full_everywhere = false;  // every replica's requests fill the candidates: wait through the ledger
  if (shared.ledger != nullptr && shared.ledger->picks(request)) {
    const auto executor = client.get_executor();  // a named value, not a temporary, across co_await
    auto answer = co_await slot_from_ledger(executor, shared, request, cost);
    slot = std::move(answer.slot);
    full_everywhere = answer.full;
  }
  if (!slot && !full_everywhere) slot = slot_without_queue(shared, request, cost);
  if (slot) co_return std::move(*slot);
  ticket = make_ticket();
  co_return co_await wait_for_slot(client, shared, request, cost, ticket, nullptr, full_everywhere);
}

}  // namespace dplb::server
