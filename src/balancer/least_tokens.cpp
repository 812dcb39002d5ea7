#include "dplb/balancer/least_tokens.hpp"

#include <algorithm>
#include <limits>

namespace dplb::balancer {

std::optional<std::size_t> least_tokens::choose(const pick_context& request, std::span<const host_view> hosts) {
  // A request whose cost is unknown (no body facts) still counts as one token, as the balancer counts it.
  const double cost = std::max(1.0, static_cast<double>(request.prompt_tokens) + request.decode_tokens);
  const auto tokens_after = [cost](const host_view& h) { return (static_cast<double>(h.cost_inflight) + cost) / h.weight; };
  double fewest_tokens = std::numeric_limits<double>::infinity();
  for (const auto& h : hosts) {
    if (h.usable) fewest_tokens = std::min(fewest_tokens, tokens_after(h));
  }
  // The hosts within a request's cost of the fewest tokens are a tie, which least-inflight settles.
  near_.assign(hosts.begin(), hosts.end());
  for (auto& h : near_) h.usable = h.usable && tokens_after(h) - fewest_tokens <= cost / h.weight;
  return lowest_score(std::span<const host_view>(near_), ties_, [](const host_view& h) { return h.inflight / h.weight; });
}

}  // namespace dplb::balancer
