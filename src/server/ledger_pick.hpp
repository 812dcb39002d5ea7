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

}  // namespace dplb::server
