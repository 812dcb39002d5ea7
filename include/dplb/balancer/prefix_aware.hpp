#pragma once
#include <vector>

#include "dplb/balancer/pending_routes.hpp"
#include "dplb/kv/event_index.hpp"

#include "dplb/balancer/policy.hpp"
#include "dplb/balancer/prefix_index.hpp"
#include "dplb/balancer/routing_stats.hpp"

namespace dplb::balancer {

struct prefix_aware_options {
  double load_bound = 1.25;                 // --load-bound: see load_bound
  std::size_t min_match_blocks = 1;         // --prefix-min-match (default 64 tokens), in blocks of prefix_block_tokens
  std::size_t index_blocks_per_rank = 16384;  // --prefix-index-blocks
  // What the engines' KV-cache events say each rank holds; null when no backend publishes them.
  const kv::event_index* events = nullptr;
  std::uint32_t block_size = 16;          // --block-size: tokens per block of the events
  std::size_t event_min_match_blocks = 4;  // --prefix-min-match in those blocks, rounded up
  // How long a route placed by load stands in for the events (queueing and prefill of a long prompt).
  std::chrono::milliseconds pending_ttl{10'000};
};

// Sends a request where its prompt's prefix is cached, so that the engine's prefix cache spares the
// prefill of what it already holds, without building a hot spot. Where a prefix is cached comes from one
// of two indexes:
//  - precise: the engines' KV-cache events (options.events), when some usable rank of the request's cluster
//    has been heard from (its first batch arrived: a configured publisher that never sent anything is no
//    evidence of an empty cache) and the request's token ids are known (pick_context::kv_chain): what each
//    rank holds, whoever put it there, and nothing an engine evicted;
//    When no usable rank holds a long enough match, the requests of its chain this policy placed by load in
//    the last pending_ttl (pending_routes.hpp) stand in: the events show a block only once its prefill ran;
//  - approximate otherwise: a prefix_index of what this policy routed (pick_context::prefix_chain).
// Then:
//  1. The rank whose blocks match the longest prefix of the request's prompt, if the match is at least
//     `min_match_blocks` (event_min_match_blocks for the events) and the rank is within the load bound;
//     several such ranks: the fewest in flight per weight, then the rotation.
//  2. Otherwise least-inflight decides, its ties going to the longer match, then to the rotation. So
//     requests that share nothing (no match anywhere) are placed exactly as least-inflight places them, and a
//     burst of them onto idle ranks is exactly round-robin.
// Either way the chosen rank then remembers the request's chain. O(chain + ranks) per pick.
class prefix_aware final : public policy {
 public:
  prefix_aware(prefix_aware_options options, routing_stats* stats)
      : options_(options), index_(options.index_blocks_per_rank), stats_(stats) {}

  std::optional<std::size_t> choose(const pick_context& request, std::span<const rank_view> ranks) override;
  // Rule 1's rank without its rotation: the longest match within the load bound (at least
  // min_match_blocks), the fewest in flight per weight among equals, then the lowest rank; nullopt when
  // rule 2 would decide.
  std::optional<place> preferred(const pick_context& request, std::span<const rank_view> ranks) override;
  // Counted as rule 1's pick, and remembered in the approximate index.
  void placed(const pick_context& request, const place& at) override;
  std::string_view name() const noexcept override { return "prefix-aware"; }
  bool needs_request_facts() const noexcept override { return true; }
  void on_state_change(std::size_t rank, std::uint8_t flags) override;

  const prefix_index& index() const { return index_; }

 private:
  void publish_size(std::size_t rank);
  // Fills matched_ for the request from the index that applies to it; returns the blocks a match needs
  // and the tokens per block.
  struct match_rule {
    std::uint32_t enough;
    std::uint32_t tokens_per_block;
  };
  match_rule match(const pick_context& request, std::span<const rank_view> ranks);

  static constexpr std::size_t pending_capacity = 1 << 16;  // blocks remembered, over all ranks

  const prefix_aware_options options_;
  prefix_index index_;
  routing_stats* stats_;  // may be null (tests)
  rotation ties_;
  std::vector<std::uint32_t> matched_;  // reused by every pick
  pending_routes pending_{options_.pending_ttl, pending_capacity};
  std::vector<std::uint32_t> pending_matched_;  // reused by every pick that consults pending_
  // How the last match() matched: from the events' evidence, from the pending routes, or neither (approximate).
  enum class evidence { events, pending, approximate } last_evidence_ = evidence::approximate;
};

}  // namespace dplb::balancer
