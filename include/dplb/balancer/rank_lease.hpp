#pragma once
// A request's claim on a rank and what it costs there. The balancer owns the counts; the lease only gives its
// claim back, exactly once.

#include <cstddef>
#include <cstdint>

namespace dplb::balancer {

class balancer;

// What a request costs the rank it runs on, in tokens (least-tokens): the prompt until the response's
// first byte (the prefill is done then), the generation until the end.
struct request_cost {
  std::uint32_t prompt = 0;
  std::uint32_t decode = 0;
  // Set by the pick, from pick_context::prompt_tokens: a long prompt (queue_limits::long_prompt_tokens), counted
  // on its rank as prefilling until rank_lease::prompt_done() or the release.
  bool long_prompt = false;
};

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
  // The prefill is over (the engine's first byte arrived): the prompt's tokens no longer weigh on the rank.
  void prompt_done() noexcept;
  void release() noexcept;

 private:
  friend class balancer;
  rank_lease(balancer* owner, std::size_t rank, request_cost cost) noexcept
      : owner_(owner), rank_(rank), cost_(cost) {}
  balancer* owner_ = nullptr;
  std::size_t rank_ = 0;
  request_cost cost_;  // what is still counted on the rank
};

}  // namespace dplb::balancer
