#pragma once
#include "dplb/balancer/policy.hpp"

namespace dplb::balancer {

// Places a request by the work its rank still owes, in tokens, while keeping the ranks' request counts
// within a small band of each other.
//
// What dplb counts per rank (rank_view::cost_inflight) is every request's prompt tokens until the response's
// first body byte (the prefill is done then) plus its max_tokens until the end (pick_context); the prompt part
// is shown apart (rank_view::prompt_inflight). They do not cost the engine alike: a prompt token waiting for
// its prefill holds up every request queued behind it on that rank (their first tokens, and under DP lockstep
// every rank's step), while a request that is decoding holds one slot of the batch per step whatever its
// max_tokens (which only says how long it will), and the batch, the number of requests, is what a step's time
// and a lockstep group's padding follow. Hence three rules:
//
//  1. Candidates: the usable ranks whose requests in flight per weight are within `request_band` of the
//     fewest. Tokens never pull the counts further apart than that: a long prompt does not empty its rank
//     of short requests (which on lockstep ranks would pad every rank's batch to the fullest one's).
//  2. Among them, the least work per weight, work_of(): the prompt tokens not yet prefilled, in full, plus
//     `decode_share` of the max_tokens in flight, plus `slot_tokens` per request in flight. A rank with a
//     long prompt not yet prefilled, or several long ones at once, is avoided (so long prompts spread over
//     the ranks, and short requests keep off the rank busy prefilling); a long generation weighs a quarter
//     of its tokens, since what it costs each step is its slot; a rank with one request fewer weighs a slot
//     less. Work within one slot of the least is a tie: estimates of text prompts differ from request to
//     request of a uniform workload, and those differences must not decide (a burst of 256 like requests on
//     4 idle ranks lands 64/64/64/64).
//  3. A tie goes to the fewest requests in flight per weight, and a tie of those to the `rotation`
//     (least-inflight's order, weighted round-robin for unequal weights).
// O(ranks) per pick, nothing allocated.
class least_tokens final : public policy {
 public:
  // How many requests in flight (per weight) a candidate may have beyond the fewest. On lockstep ranks every
  // request of spread can pad the whole group's batch to the next CUDA-graph size (they step by 8): with 2,
  // the tokens benchmark measured 13-18% more padded decode tokens than least-inflight's and a throughput
  // within 3% of it; with no band, least-tokens lost 12-25%.
  static constexpr double request_band = 2;
  // What one request's place in the batch weighs against tokens: a request in flight counts as this many
  // tokens besides its own (about one 1,000-token prompt, the order of a typical request's whole cost).
  static constexpr double slot_tokens = 1024;
  // What a token of max_tokens (a generation to come) weighs against a prompt token not yet prefilled: a
  // request's steps cost its slot, so its max_tokens only tells how long that lasts.
  static constexpr double decode_share = 0.25;

  std::optional<std::size_t> choose(const pick_context& request, std::span<const rank_view> ranks) override;
  std::string_view name() const noexcept override { return "least-tokens"; }
  bool needs_request_facts() const noexcept override { return true; }

  // The work a rank owes per unit of weight, as rule 2 weighs it.
  static double work_of(const rank_view& h) noexcept;

 private:
  rotation ties_;
};

}  // namespace dplb::balancer
