#pragma once
// One replica's side of the ledger that dplb replicas share in Redis (issue 29): every rank's requests in
// flight over all live replicas, read and changed by the Redis Functions of ledger_functions.hpp, one atomic
// step per pick. Runs on the io_context it is given (one thread; every call and callback on it).
//
// The replica stays in the ledger under a lease it renews by registering its own counts every
// `renew_every`: a replica that stops renewing leaves within `lease`; a server restarted empty (or
// flushed) gets every replica's counts back at the next registration, and a replica restarted under the
// same name replaces its previous incarnation's. A registration is sent first on every new connection and
// otherwise only while no pick is waiting for its answer, so the counts it sends (`in_flight()`, which must
// already count every pick whose answer was handed to the caller) are exactly what the ledger should hold.

#include "dplb/ledger/redis_client.hpp"
#include "dplb/ledger/redis_url.hpp"

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace dplb::ledger {

enum class ledger_policy { least_inflight, round_robin, least_tokens, least_load };

// least-tokens' rule, as the balancer's least_tokens policy has it (the caller passes its constants: the
// ledger includes nothing of the balancer).
struct least_tokens_rule {
  double request_band = 2;
  double slot_tokens = 1024;
  double decode_share = 0.25;
};

// What a request will cost its rank, in tokens: recorded with its pick, given back with its release (the
// prompt part at its first byte, by prompt_done).
struct request_tokens {
  std::uint64_t prompt = 0;
  std::uint64_t decode = 0;  // max_tokens (or the default) times n
};

// A rank's load from one replica's requests, or from all of them.
struct rank_load {
  std::uint32_t requests = 0;
  std::uint64_t prompt_tokens = 0;  // prompt tokens not yet prefilled
  std::uint64_t cost_tokens = 0;    // tokens still owed: prompts not yet prefilled and decode tokens
  bool operator==(const rank_load&) const = default;
};

struct ledger_options {
  redis_endpoint endpoint;
  std::string ns;       // the ledger's keys are `{dplb:<ns>}:...` (later: a digest of the backend list)
  std::string replica;  // this replica's name in the ledger
  std::chrono::milliseconds timeout{20};  // every pick, release and registration
  std::chrono::milliseconds connect_timeout{1000};
  std::chrono::milliseconds lease{3000};  // the ledger forgets a replica this long after its last call
  std::chrono::milliseconds renew_every{1000};
  std::chrono::milliseconds backoff_min{100}, backoff_max{1000};
  least_tokens_rule least_tokens;
};

// A rank the caller could use for this pick, and its weight (> 0).
struct ledger_candidate {
  std::size_t rank = 0;
  double weight = 1;
  // least-load: the least the rank's load can be, from what its engine reports (running and waiting, and
  // a term for a full KV cache): the pick weighs max(every replica's requests, floor).
  double floor = 0;
};

struct ledger_pick {
  bool ok = false;                  // the ledger answered; if not, `error` says why and the caller picks alone
  std::optional<std::size_t> rank;  // the rank picked and recorded; none: every candidate is at the limit
  std::vector<std::uint32_t> counts;  // the candidates' global counts the pick saw (in the candidates' order)
  std::uint32_t replicas = 0;         // live replicas the ledger held
  std::string error;
};

// The ledger's view: live replicas and every rank's global count.
struct ledger_view {
  bool ok = false;
  std::uint32_t replicas = 0;
  std::map<std::size_t, std::uint32_t> total;  // requests
  std::map<std::size_t, rank_load> load;        // requests and tokens
  std::string error;
};

// What a shared rate limit answered to a take.
struct bucket_answer {
  bool ok = false;     // the ledger answered; if not, `error` says why and the caller limits alone
  bool taken = false;
  std::size_t refused = 0;  // not taken: which bucket refused (its index among those taken from together)
  std::optional<std::chrono::milliseconds> retry_after;  // not taken: when its units will be there (none: never)
  std::string error;
};

enum class ledger_op : std::size_t { connect, pick, release, register_, view, bucket, count };

class shared_ledger {
 public:
  using in_flight_fn = std::function<std::map<std::size_t, rank_load>()>;
  using freed_fn = std::function<void(std::size_t rank)>;

  // in_flight: this replica's requests (and their tokens) in flight per rank, as it counts them. on_freed: a slot was freed
  // on a rank (by any replica, this one included).
  shared_ledger(boost::asio::io_context& io, ledger_options options, in_flight_fn in_flight, freed_fn on_freed);
  ~shared_ledger();
  shared_ledger(const shared_ledger&) = delete;
  shared_ledger& operator=(const shared_ledger&) = delete;

  void start();

  // Picks among the candidates under `limit` (0: none) and records the pick, in one step in Redis.
  void pick(std::span<const ledger_candidate> candidates, ledger_policy policy, std::uint32_t limit,
            std::function<void(const ledger_pick&)> done);
  // The same, recording the request's tokens (least-tokens weighs them; any policy may record them).
  void pick(std::span<const ledger_candidate> candidates, ledger_policy policy, std::uint32_t limit,
            request_tokens tokens, std::function<void(const ledger_pick&)> done);
  // The same, taking a turn of group `group`'s rotation (a cluster's: ties and round-robin rotate within
  // each group of ranks on its own; the overloads above use group 0).
  void pick(std::span<const ledger_candidate> candidates, ledger_policy policy, std::uint32_t limit,
            request_tokens tokens, std::size_t group, std::function<void(const ledger_pick&)> done);
  // Gives back one of this replica's requests on the rank (dropped while down: the registration after
  // the reconnect sends the counts as they are then).
  void release(std::size_t rank);
  // The same, giving back the request's tokens: its prompt tokens still counted (none after prompt_done)
  // and the cost it still holds (its decode tokens, and its prompt tokens before prompt_done).
  void release(std::size_t rank, std::uint64_t prompt_left, std::uint64_t cost);
  // A request's prompt is prefilled (its first byte came): its prompt tokens leave the rank's prompt load
  // and its cost, as they leave the balancer's counts.
  void prompt_done(std::size_t rank, std::uint64_t prompt);
  // Sends this replica's counts now (also done on every connect and every renew_every).
  void register_in_flight();
  void view(std::function<void(const ledger_view&)> done);

  // A token bucket every replica takes from (`rate` units a second, `burst` deep), named by the caller
  // (e.g. a tenant's name and what it limits): as tenants::token_bucket's try_take, give_back and charge.
  struct bucket_spec {
    std::string name;
    double rate = 1;
    std::uint64_t burst = 1;
  };
  struct bucket_take {
    bucket_spec bucket;
    std::uint64_t units = 0;
  };
  // Takes every bucket's units if every one holds them, else none (a request refused by one limit takes
  // nothing from the others), in one step in Redis.
  void take(std::span<const bucket_take> takes, std::function<void(const bucket_answer&)> done);
  void take(const bucket_spec& bucket, std::uint64_t units, std::function<void(const bucket_answer&)> done);
  void give_back(const bucket_spec& bucket, std::uint64_t units);
  void charge(const bucket_spec& bucket, std::uint64_t units);

  // Any thread.
  bool up() const noexcept;
  bool subscribed() const noexcept;
  std::uint64_t errors(ledger_op op) const noexcept;

 private:
  struct impl;
  std::shared_ptr<impl> impl_;
};

// The names of ledger_op, for a metric's label.
std::string_view ledger_op_name(ledger_op op);

}  // namespace dplb::ledger
