#pragma once
// This replica's link to the ledger dplb replicas share in Redis (--shared-state): the shared_ledger
// (ledger/shared_ledger.hpp) on a thread of its own, the picks it makes for the balancer, and the balancer's
// releases and first bytes told to it.
//
// A pick through the ledger is one atomic step in Redis over every live replica's counts (the rule of the
// request's cluster: least-inflight, round-robin, least-tokens or least-load, under --max-inflight-per-rank
// counted over all replicas), then counted here on the rank it chose, on the ledger's thread before anyone
// hears the answer. A pick the ledger does not answer within --shared-state-timeout-ms (Redis down, paused
// or slow) comes back empty, and the caller picks by this replica's own counts; so do requests whose pick
// stays local (see picks()). Those are recorded in the ledger as they are made (a pick with one candidate),
// so that every release gives back a count the ledger had. What this replica has told the ledger is
// mirrored on the ledger's thread, in the order of the calls, and that mirror is what it registers (every
// second and on every reconnect): exact whatever races on other threads, and what puts a fresh Redis right.
//
// Threading contract: every member may be called from any thread, except start() and stop(), called once
// each by the thread that owns the object. Callbacks run on the ledger's thread and must not block.

#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dplb/balancer/balancer.hpp"
#include "dplb/ledger/shared_ledger.hpp"
#include "dplb/support/atomic_histogram.hpp"

namespace dplb::balancer {

struct replica_ledger_options {
  ledger::ledger_options ledger;
  // Per cluster: the rule the ledger picks its requests by, or none when its policy picks here (by what
  // only this replica knows: engine stats, prefixes); such requests count in the ledger all the same.
  std::vector<std::optional<ledger::ledger_policy>> rules;
};

// The ledger's rule for a policy of that name, if it has one.
std::optional<ledger::ledger_policy> ledger_rule_for(std::string_view policy_name);

class replica_ledger final : public release_listener {
 public:
  // `b` must outlive this object; set this as its release listener after start().
  replica_ledger(balancer& b, replica_ledger_options options);
  ~replica_ledger() override;
  replica_ledger(const replica_ledger&) = delete;
  replica_ledger& operator=(const replica_ledger&) = delete;

  void start();
  // Stops the thread. Releases after it are dropped (the ledger forgets this replica within its lease).
  void stop() noexcept;

  // Whether the ledger picks this request: it is up, the request's cluster has a rule (or the request is
  // pinned: the ledger then records it), it follows no session (--affinity-header picks here) and it is
  // no retry.
  bool picks(const pick_context& request) const noexcept;

  enum class pick_outcome {
    chosen,      // the lease is on the rank the ledger chose, counted in the balancer
    full,        // every candidate is at --max-inflight-per-rank over all replicas: wait()
    unanswered,  // no answer in time, or a rank that is no longer usable here, or no candidate: pick locally
  };
  // Asks the ledger (under --max-inflight-per-rank, counted over all replicas). `done` is called once, on
  // the ledger's thread (or on the caller's, at once, when the request has no candidate); its lease is
  // empty unless the outcome is `chosen`.
  void pick(const pick_context& request, request_cost cost, std::function<void(rank_lease, pick_outcome)> done);

  // Under --max-inflight-per-rank: waits for a slot freed on any candidate by any replica, in the order of
  // priority (lowest first), then arrival. A slot freed anywhere is heard through the ledger's channel and,
  // so that nothing rests on that channel alone, the head waiter asks again every 50 ms. `deliver` is
  // called once on the ledger's thread with the lease, counted in the balancer, or with an empty one when
  // the ledger stopped answering (then wait locally) — unless cancel() came first. Returns the waiter's
  // id, 0 when --max-queued-requests waiters wait already (refused).
  std::uint64_t wait(const pick_context& request, request_cost cost, std::int64_t priority,
                     std::function<void(rank_lease)> deliver);
  // The waiter gave up; a lease delivered meanwhile is the caller's to release.
  void cancel(std::uint64_t id);
  std::size_t waiting() const noexcept;

  // Rate limits every replica shares (a tenant's requests_per_second and tokens_per_minute): takes from every
  // bucket or from none, in one step in the ledger. `done` runs once, on the ledger's thread (or on the
  // caller's, at once, when the ledger is stopped); an answer that is not ok (Redis away or slow) leaves the
  // limits to this replica; once stop() has run, it may never be called (the caller bounds its wait). give_back
  // and charge settle a reservation taken so.
  using bucket_take = ledger::shared_ledger::bucket_take;
  using bucket_spec = ledger::shared_ledger::bucket_spec;
  void take(std::vector<bucket_take> takes, std::function<void(const ledger::bucket_answer&)> done);
  void give_back(bucket_spec bucket, std::uint64_t units) noexcept;
  void charge(bucket_spec bucket, std::uint64_t units) noexcept;

  // The ledger's own view (every replica's counts), for the admin API and the status page; `done` runs on
  // the ledger's thread.
  void view(std::function<void(const ledger::ledger_view&)> done);

  // The ledger's view as of its last refresh (every second): every replica's requests in flight per rank,
  // and the live replicas. Empty before the first answer; kept while Redis is down (see its age).
  struct view_snapshot {
    std::uint32_t replicas = 0;
    std::map<std::size_t, std::uint32_t> inflight;  // ranks with requests in flight over all replicas
    std::chrono::steady_clock::time_point taken{};
  };
  std::optional<view_snapshot> last_view() const;

  void picked(std::size_t rank, request_cost counted) noexcept override;
  void released(std::size_t rank, request_cost held) noexcept override;
  void prompt_done(std::size_t rank, std::uint32_t prompt) noexcept override;

  const std::string& replica_name() const noexcept;
  bool up() const noexcept;
  std::uint64_t errors(ledger::ledger_op op) const noexcept;
  std::uint32_t replicas() const noexcept;  // live replicas at the ledger's last answer (0: none yet)
  const support::atomic_histogram& pick_seconds() const noexcept;  // each pick's round trip, answered or not
  std::uint64_t shared_picks() const noexcept;  // picks the ledger made
  std::uint64_t local_picks() const noexcept;   // picks it was asked for but left to this replica

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

}  // namespace dplb::balancer
