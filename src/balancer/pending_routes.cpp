#include "dplb/balancer/pending_routes.hpp"

#include <algorithm>
#include <optional>

namespace dplb::balancer {

void pending_routes::remember(std::size_t rank, std::span<const std::uint64_t> chain, clock::time_point now) {
  expire(now);
  const auto until = now + ttl_;
  for (const auto block : chain.first(std::min(chain.size(), max_blocks))) {
    routes_[block] = route{static_cast<std::uint32_t>(rank), until};
    order_.emplace_back(block, until);
  }
  // Beyond the bound the oldest entries go, whatever their time.
  while (order_.size() > capacity_) {
    const auto [block, when] = order_.front();
    order_.pop_front();
    if (const auto it = routes_.find(block); it != routes_.end() && it->second.until == when) routes_.erase(it);
  }
}

void pending_routes::expire(clock::time_point now) {
  while (!order_.empty() && order_.front().second <= now) {
    const auto [block, when] = order_.front();
    order_.pop_front();
    if (const auto it = routes_.find(block); it != routes_.end() && it->second.until == when) routes_.erase(it);
  }
}

void pending_routes::match(std::span<const std::uint64_t> chain, std::size_t ranks, clock::time_point now,
                           std::vector<std::uint32_t>& matched) const {
  matched.assign(ranks, 0);
  std::optional<std::uint32_t> rank;
  std::uint32_t length = 0;
  // Each block has one latest route: the match is the run of leading blocks all routed to the same rank.
  for (const auto block : chain.first(std::min(chain.size(), max_blocks))) {
    const auto it = routes_.find(block);
    if (it == routes_.end() || it->second.until <= now || (rank && *rank != it->second.rank)) break;
    rank = it->second.rank;
    ++length;
  }
  if (rank && *rank < ranks) matched[*rank] = length;
}

void pending_routes::forget(std::size_t rank) {
  boost::unordered::erase_if(routes_, [&](const auto& entry) { return entry.second.rank == rank; });
}

}  // namespace dplb::balancer
