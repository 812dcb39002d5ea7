#pragma once
// The one shared truth of per-rank load. Every worker thread picks through the same balancer, so a
// burst is spread exactly even with several threads; there are no per-thread copies of the counts.
//
// Threading contract: every member may be called from any thread. acquire() holds a mutex for the
// policy's choice and the increment together (a pick and its count are one step, so two threads can
// never both see a rank as least loaded). Releases and reads are lock-free atomics.

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "dplb/balancer/policy.hpp"

namespace dplb::balancer {

class balancer;

// One request's claim on a rank: counted in-flight from acquire() until the lease is destroyed or
// released. Move-only RAII so that every exit path (normal end, client close, upstream error,
// exception) gives the slot back exactly once.
class rank_lease {
 public:
  rank_lease() = default;
  rank_lease(rank_lease&& other) noexcept;
  rank_lease& operator=(rank_lease&& other) noexcept;
  rank_lease(const rank_lease&) = delete;
  rank_lease& operator=(const rank_lease&) = delete;
  ~rank_lease() { release(); }

  explicit operator bool() const noexcept { return owner_ != nullptr; }
  std::size_t rank() const noexcept { return rank_; }
  void release() noexcept;

 private:
  friend class balancer;
  rank_lease(balancer* owner, std::size_t rank) noexcept : owner_(owner), rank_(rank) {}
  balancer* owner_ = nullptr;
  std::size_t rank_ = 0;
};

class balancer {
 public:
  balancer(std::size_t rank_count, std::unique_ptr<policy> chosen_policy);

  // Chooses a rank and counts the request on it; an empty lease when no rank is usable.
  rank_lease acquire();
  // The same, never choosing a rank whose entry in `excluded` is true (a retry after a failure there).
  rank_lease acquire(const std::vector<bool>& excluded);

  // Marks a rank usable or not (health checks, ejection). In-flight requests on it are unaffected.
  void set_usable(std::size_t rank, bool usable);
  bool usable(std::size_t rank) const noexcept;

  std::size_t rank_count() const noexcept { return ranks_.size(); }
  std::uint32_t inflight(std::size_t rank) const noexcept;
  std::uint64_t picks(std::size_t rank) const noexcept;  // requests ever sent to the rank
  bool any_usable() const noexcept;

  // max - min in-flight over the usable ranks (0 when fewer than two are usable).
  std::uint32_t inflight_skew() const noexcept;

  const policy& active_policy() const noexcept { return *policy_; }

 private:
  friend class rank_lease;
  void release(std::size_t rank) noexcept;

  struct rank_state {
    std::atomic<std::uint32_t> inflight{0};
    std::atomic<std::uint64_t> picks{0};
    std::atomic<bool> usable{true};
  };

  mutable std::mutex pick_mutex_;
  std::unique_ptr<policy> policy_;
  std::vector<rank_state> ranks_;  // sized once; never resized (atomics are not movable)
  std::vector<rank_view> view_;    // scratch for choose(); guarded by pick_mutex_
};

}  // namespace dplb::balancer
