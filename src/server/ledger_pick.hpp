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

// Nullopt when the caller must pick by its own counts.
inline io::task<std::optional<slot_result>> slot_from_ledger(const io::executor& executor, shared_state& shared,
                                                             const balancer::pick_context& request,
                                                             balancer::request_cost cost) {
  struct answer_state {
    explicit answer_state(const io::executor& ex) : timer(ex) {}
    io::steady_timer timer;
    balancer::rank_lease lease;
    bool answered = false;
    bool gave_up = false;
  };
  auto state = std::make_shared<answer_state>(executor);
  state->timer.expires_after(2 * shared.settings.shared_state_timeout + std::chrono::milliseconds(50));
  shared.ledger->pick(request, cost, [state, executor](balancer::rank_lease lease) {
    boost::asio::post(executor, [state, lease = std::move(lease)]() mutable {
      if (state->gave_up) return;  // too late: the lease is released right here
      state->answered = true;
      state->lease = std::move(lease);
      state->timer.cancel();
    });
  });
  if (!state->answered) co_await state->timer.async_wait(io::as_result);
  if (!state->answered) {
    state->gave_up = true;
    co_return std::nullopt;
  }
  if (!state->lease) co_return std::nullopt;
  co_return slot_result{std::move(state->lease)};
}

}  // namespace dplb::server
