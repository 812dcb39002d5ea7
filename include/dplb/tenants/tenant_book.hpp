#pragma once
// The tenants as dplb runs them: whom a request belongs to (tenant_directory, replaced whole by a reload), and
// each tenant's live state (tenant_state): its limits, its rate buckets, its counts. A tenant's live state is
// kept by name across reloads, so that a reload neither refills a tenant's buckets nor loses the counts of
// its queued and in-flight requests; a tenant that a reload drops keeps its state (its metric series stay,
// frozen), and gets it back if a later reload lists it again. The metric labels are thus the names ever
// configured: bounded by the configuration, never by what clients send.
//
// Threading contract: identify(), tenants() and every tenant_state member may be called from any thread;
// reload() from one thread at a time.

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "dplb/tenants/tenant_directory.hpp"
#include "dplb/tenants/token_bucket.hpp"

namespace dplb::tenants {

// Why a tenant's request is refused before it is queued or sent, and when to come back.
struct verdict {
  // larger_than_budget: the request's tokens exceed the whole token budget, so that no wait would ever let it
  // through; it has no Retry-After (0), and names its cost against the budget's depth.
  enum class refusal { none, request_rate, token_budget, larger_than_budget };
  refusal why = refusal::none;
  std::int64_t retry_after_seconds = 0;  // for a refusal that waiting cures: the Retry-After header, at least 1
  std::uint64_t tokens = 0;              // larger_than_budget: the request's tokens
  std::uint64_t budget = 0;              // larger_than_budget: the most the budget holds (a minute's worth)

  bool admitted() const noexcept { return why == refusal::none; }
};

class tenant_state {
 public:
  using clock = std::chrono::steady_clock;
  using limits = tenant_directory::tenant;

  tenant_state(std::string name, std::uint64_t id);

  const std::string& name() const noexcept { return name_; }
  // A number of its own, never reused: how dplb's queue tells tenants apart (0: the default tenant).
  std::uint64_t id() const noexcept { return id_; }
  limits current_limits() const;
  // What dplb's queue and the session read of the limits for every request (no allocation).
  struct queue_terms {
    std::uint32_t weight = 1;
    std::size_t max_queued = static_cast<std::size_t>(-1);  // unset: no limit
    std::chrono::milliseconds max_queue_wait{0};            // unset: 0, the process-wide one applies
  };
  queue_terms terms() const;
  // Whether the tenant has a token budget (tokens_per_minute): then a request's tokens are reckoned.
  bool has_token_budget() const noexcept { return has_token_budget_.load(std::memory_order_relaxed); }
  // The lowest priority its requests may have (min_priority): the priority a request is served with is its
  // body's (0 when absent) raised to this. Without a min_priority, the lowest integer: nothing is raised.
  std::int64_t min_priority() const noexcept { return min_priority_.load(std::memory_order_relaxed); }
  bool has_min_priority() const noexcept { return min_priority() != std::numeric_limits<std::int64_t>::min(); }
  // A request's priority as its tenant lets it be: `asked` (the body's, 0 when absent) raised to min_priority.
  std::int64_t allowed_priority(std::int64_t asked) const noexcept { return std::max(asked, min_priority()); }

  // What a request that sets no max_tokens reserves from the token budget: its prompt and the most it may
  // generate (the model's remaining context), but no more than the whole budget, nor less than its prompt.
  // Bounded by its own choice, such a request would be refused as larger than the budget for a length it never
  // asked for; it is charged what it generated when it ends. Without a token budget: the sum.
  std::uint64_t unbounded_reservation(std::uint64_t prompt, std::uint64_t most_generated) const;

  // The request rate first, then the token budget, which reserves `tokens` (the prompt plus what may be
  // generated) until settle(). A refused request takes nothing from either. A tenant without either limit
  // takes no lock: the usual request only counts itself.
  verdict admit(clock::time_point now, std::uint64_t tokens);
  // With --shared-state the rate and the budget are buckets every replica takes from (in the shared ledger):
  // their terms, as this tenant's own buckets have them. No such limit: none.
  struct bucket_terms {
    double rate = 1;  // units a second
    std::uint64_t burst = 1;
  };
  struct shared_limits {
    std::optional<bucket_terms> requests;  // requests_per_second, burst
    std::optional<bucket_terms> tokens;    // tokens_per_minute, a minute's worth deep
  };
  bool limited() const noexcept { return limited_.load(std::memory_order_relaxed); }
  shared_limits limits_to_share() const;
  // What only this replica judges of a request the shared buckets admit: a request larger than the whole
  // budget (refused, larger_than_budget), else admitted.
  verdict judge_size(std::uint64_t tokens) const;
  // A request the shared buckets admitted: counted in requests_per_second as admit() counts its own.
  void count_admitted(clock::time_point now) noexcept { note_admitted(now); }

  // The engine reported what an admitted request used, `used` tokens of the `reserved` ones (more or fewer):
  // the budget is corrected. Nothing used (a request that never reached an engine): the reservation comes back.
  void settle(clock::time_point now, std::uint64_t reserved, std::uint64_t used);

  // A request of this tenant got its answer: counted by status (dplb_tenant_requests_total{code}).
  void count_status(unsigned status) noexcept;
  void count_tokens(std::uint64_t prompt, std::uint64_t completion) noexcept;
  // Requests queued for a rank, and holding one, now.
  void add_queued(std::int64_t delta) noexcept { queued_.fetch_add(delta, std::memory_order_relaxed); }
  void add_in_flight(std::int64_t delta) noexcept { in_flight_.fetch_add(delta, std::memory_order_relaxed); }

  // What the metrics and the admin API show.
  struct snapshot {
    std::string name;
    tenant_directory::tenant limits;
    std::int64_t queued = 0;
    std::int64_t in_flight = 0;
    double requests_per_second = 0;  // admitted over the last rate_window
    std::uint64_t prompt_tokens = 0;
    std::uint64_t completion_tokens = 0;
    std::vector<std::pair<unsigned, std::uint64_t>> requests_by_status;  // statuses seen, ascending
  };
  snapshot read(clock::time_point now) const;

  // A reload's limits. Buckets whose limit is unchanged are kept; a changed one starts as full as the old
  // one was (its debt carried over), so that a reload neither grants nor takes a burst.
  void apply(const limits& next, clock::time_point now);

  // How far back requests_per_second looks.
  static constexpr int rate_window_seconds = 10;

 private:
  verdict judge_size_locked(std::uint64_t tokens) const;  // mutex_ held
  void note_admitted(clock::time_point now) noexcept;
  double admitted_rate(clock::time_point now) const noexcept;

  const std::string name_;
  const std::uint64_t id_;
  mutable std::mutex mutex_;  // guards what follows, up to the atomics
  limits limits_;
  std::optional<token_bucket> request_rate_;
  std::optional<token_bucket> token_budget_;
  std::atomic<bool> limited_{false};  // a request rate or a token budget is set
  std::atomic<bool> has_token_budget_{false};
  std::atomic<std::int64_t> min_priority_{std::numeric_limits<std::int64_t>::min()};
  // Admitted requests per second over the last rate_window_seconds, a ring indexed by the second, lock-free:
  // each slot holds the second it counts (high bits) and its count (low count_bits, saturating).
  static constexpr unsigned count_bits = 24;
  std::array<std::atomic<std::uint64_t>, rate_window_seconds> admitted_{};
  std::atomic<std::int64_t> queued_{0};
  std::atomic<std::int64_t> in_flight_{0};
  std::atomic<std::uint64_t> prompt_tokens_{0};
  std::atomic<std::uint64_t> completion_tokens_{0};
  std::array<std::atomic<std::uint64_t>, 600> by_status_{};  // by HTTP status, 100..599
};

class tenant_book {
 public:
  // Throws std::invalid_argument (tenant_directory's message) for specs it refuses.
  explicit tenant_book(std::span<const tenant_spec> specs, tenant_state::clock::time_point now = tenant_state::clock::now());

  struct identity {
    std::shared_ptr<tenant_state> tenant;  // never null
    bool known_key = false;                // the request presented a configured API key
  };
  // The tenant of a request with these Authorization and tenant-header values ("" when absent).
  identity identify(std::string_view authorization, std::string_view tenant_header) const;

  // Replaces the tenants. Throws std::invalid_argument, changing nothing, for specs the directory refuses.
  void reload(std::span<const tenant_spec> specs, tenant_state::clock::time_point now = tenant_state::clock::now());

  // The tenants configured now, the default one first.
  std::vector<std::shared_ptr<tenant_state>> tenants() const;
  // Every tenant ever configured, by name: the metrics' series.
  std::vector<std::shared_ptr<tenant_state>> every_tenant() const;

 private:
  struct roster {
    tenant_directory directory;
    std::vector<std::shared_ptr<tenant_state>> states;  // by the directory's index
  };
  std::shared_ptr<const roster> current() const;
  std::shared_ptr<const roster> make_roster(std::span<const tenant_spec> specs, tenant_state::clock::time_point now);

  mutable std::mutex mutex_;  // guards known_ and next_id_, and serialises reloads
  std::atomic<std::shared_ptr<const roster>> roster_;  // read by every request without a lock
  std::map<std::string, std::shared_ptr<tenant_state>, std::less<>> known_;  // every tenant ever configured
  std::uint64_t next_id_ = 0;
};

}  // namespace dplb::tenants
