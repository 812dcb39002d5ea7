#pragma once
// Private to the session: a pick made by the ledger dplb replicas share (--shared-state). The answer (a lease
// already counted in the balancer) comes as ledger_wait.hpp says; without a rank, the caller picks by its
// own counts.

#include <functional>
#include <optional>
#include <utility>

#include "dplb/balancer/replica_ledger.hpp"
#include "dplb/server/proxy_context.hpp"
#include "dplb/support/io_types.hpp"
#include "ledger_wait.hpp"
#include "slot_wait.hpp"

namespace dplb::server {

struct ledger_answer {
  std::optional<slot_result> slot;  // none: pick by the replica's own counts, unless `full`
  bool full = false;  // every candidate is at --max-inflight-per-rank over all replicas: wait for a slot
};

inline io::task<ledger_answer> slot_from_ledger(const io::executor& executor, shared_state& shared,
                                                const balancer::pick_context& request, balancer::request_cost cost) {
  using outcome = balancer::replica_ledger::pick_outcome;
  using said = std::pair<balancer::rank_lease, outcome>;
  auto got = co_await await_ledger<said>(executor, ledger_patience(shared.settings), [&](std::function<void(said)> reply) {
    shared.ledger->pick(request, cost, [reply = std::move(reply)](balancer::rank_lease lease, outcome o) {
      reply(said{std::move(lease), o});
    });
  });
  ledger_answer answer;
  if (!got) co_return answer;
  answer.full = got->second == outcome::full;
  if (got->first) answer.slot = slot_result{std::move(got->first)};
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
