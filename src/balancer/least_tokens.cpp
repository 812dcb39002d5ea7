#include "dplb/balancer/least_tokens.hpp"

#include <algorithm>
#include <limits>

namespace dplb::balancer {

double least_tokens::work_of(const rank_view& h) noexcept {
  const auto prompt = static_cast<double>(h.prompt_inflight);
  const auto decode = static_cast<double>(h.cost_inflight - std::min(h.prompt_inflight, h.cost_inflight));
  return (prompt + decode_share * decode + slot_tokens * h.inflight) / h.weight;
}

std::optional<std::size_t> least_tokens::choose(const pick_context& /*request*/, std::span<const rank_view> ranks) {
  // Rule 1: only the ranks within the band of the fewest requests in flight are candidates.
  double fewest_requests = std::numeric_limits<double>::infinity();
  for (const auto& h : ranks) {
    if (h.usable) fewest_requests = std::min(fewest_requests, h.inflight / h.weight);
  }
  const auto in_band = [&](const rank_view& h) { return h.inflight / h.weight - fewest_requests <= request_band / h.weight; };
  // Rule 2: among them, the least work; within one slot of it is a tie.
  double least_work = std::numeric_limits<double>::infinity();
  for (const auto& h : ranks) {
    if (h.usable && in_band(h)) least_work = std::min(least_work, work_of(h));
  }
  const auto near_least_work = [&](const rank_view& h) {
    return in_band(h) && work_of(h) - least_work <= slot_tokens / h.weight;
  };
  // Rule 3: a tie goes to the fewest requests in flight per weight, and a tie of those to the rotation.
  return lowest_score(ranks, ties_, [](const rank_view& h) { return h.inflight / h.weight; }, near_least_work);
}

}  // namespace dplb::balancer
