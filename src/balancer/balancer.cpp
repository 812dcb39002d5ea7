#include "dplb/balancer/balancer.hpp"

#include <algorithm>
#include <limits>
#include <stdexcept>
#include <utility>

namespace dplb::balancer {

rank_lease::rank_lease(rank_lease&& other) noexcept
    : owner_(std::exchange(other.owner_, nullptr)), rank_(other.rank_) {}

rank_lease& rank_lease::operator=(rank_lease&& other) noexcept {
  if (this != &other) {
    release();
    owner_ = std::exchange(other.owner_, nullptr);
    rank_ = other.rank_;
  }
  return *this;
}

void rank_lease::release() noexcept {
  if (auto* owner = std::exchange(owner_, nullptr)) owner->release(rank_);
}

balancer::balancer(std::size_t rank_count, std::unique_ptr<policy> chosen_policy)
    : policy_(std::move(chosen_policy)), ranks_(rank_count), view_(rank_count) {
  if (rank_count == 0) throw std::invalid_argument("balancer needs at least one rank");
  if (!policy_) throw std::invalid_argument("balancer needs a policy");
}

rank_lease balancer::acquire() { return acquire(std::vector<bool>()); }

rank_lease balancer::acquire(const std::vector<bool>& excluded) {
  std::lock_guard lock(pick_mutex_);
  for (std::size_t i = 0; i < ranks_.size(); ++i) {
    view_[i].inflight = ranks_[i].inflight.load(std::memory_order_relaxed);
    view_[i].usable = ranks_[i].usable.load(std::memory_order_relaxed) && !(i < excluded.size() && excluded[i]);
  }
  const auto chosen = policy_->choose(view_);
  if (!chosen || *chosen >= ranks_.size()) return {};
  // Incremented while the lock is held: the next pick, on any thread, already sees this request.
  ranks_[*chosen].inflight.fetch_add(1, std::memory_order_relaxed);
  ranks_[*chosen].picks.fetch_add(1, std::memory_order_relaxed);
  return rank_lease(this, *chosen);
}

void balancer::release(std::size_t rank) noexcept {
  ranks_[rank].inflight.fetch_sub(1, std::memory_order_relaxed);
}

void balancer::set_usable(std::size_t rank, bool usable) {
  ranks_.at(rank).usable.store(usable, std::memory_order_relaxed);
}

bool balancer::usable(std::size_t rank) const noexcept {
  return ranks_[rank].usable.load(std::memory_order_relaxed);
}

std::uint32_t balancer::inflight(std::size_t rank) const noexcept {
  return ranks_[rank].inflight.load(std::memory_order_relaxed);
}

std::uint64_t balancer::picks(std::size_t rank) const noexcept {
  return ranks_[rank].picks.load(std::memory_order_relaxed);
}

bool balancer::any_usable() const noexcept {
  return std::any_of(ranks_.begin(), ranks_.end(),
                     [](const rank_state& r) { return r.usable.load(std::memory_order_relaxed); });
}

std::uint32_t balancer::inflight_skew() const noexcept {
  std::uint32_t lo = std::numeric_limits<std::uint32_t>::max();
  std::uint32_t hi = 0;
  std::size_t usable_count = 0;
  for (const auto& r : ranks_) {
    if (!r.usable.load(std::memory_order_relaxed)) continue;
    const auto n = r.inflight.load(std::memory_order_relaxed);
    lo = std::min(lo, n);
    hi = std::max(hi, n);
    ++usable_count;
  }
  return usable_count < 2 ? 0 : hi - lo;
}

}  // namespace dplb::balancer
