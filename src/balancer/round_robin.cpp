#include "dplb/balancer/round_robin.hpp"

namespace dplb::balancer {

namespace {

bool equal_weights(std::span<const host_view> hosts) {
  const host_view* first = nullptr;
  for (const auto& h : hosts) {
    if (!h.usable) continue;
    if (first && h.weight != first->weight) return false;
    first = &h;
  }
  return true;
}

}  // namespace

std::optional<std::size_t> round_robin::choose(const pick_context&, std::span<const host_view> hosts) {
  const std::size_t n = hosts.size();
  if (equal_weights(hosts)) {
    // Plain rotation: the next usable rank after the last pick.
    for (std::size_t step = 0; step < n; ++step) {
      const std::size_t candidate = (next_ + step) % n;
      if (hosts[candidate].usable) {
        next_ = (candidate + 1) % n;
        return candidate;
      }
    }
    return std::nullopt;
  }
  if (credit_.size() != n) credit_.assign(n, 0.0);
  std::optional<std::size_t> best;
  double total = 0;
  for (std::size_t i = 0; i < n; ++i) {
    if (!hosts[i].usable) continue;
    credit_[i] += hosts[i].weight;
    total += hosts[i].weight;
    if (!best || credit_[i] > credit_[*best]) best = i;
  }
  if (best) {
    credit_[*best] -= total;
    next_ = (*best + 1) % n;
  }
  return best;
}

}  // namespace dplb::balancer
