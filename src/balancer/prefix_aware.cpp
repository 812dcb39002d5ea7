#include "dplb/balancer/prefix_aware.hpp"

#include <algorithm>

namespace dplb::balancer {

prefix_aware::match_rule prefix_aware::match(const pick_context& request, std::span<const rank_view> ranks) {
  // The events speak for a request whose tokens are known, where some usable rank (of its cluster) has been
  // heard from; a cluster whose ranks publish none, or have not published yet, keeps the approximate index.
  const auto publishes = [&](const rank_view& h) {
    const auto* feed = options_.events->feed(static_cast<std::size_t>(&h - ranks.data()));
    return h.usable && feed != nullptr && feed->heard.load(std::memory_order_relaxed);
  };
  if (options_.events != nullptr && !request.kv_chain.empty() && options_.events->any_configured() &&
      std::ranges::any_of(ranks, publishes)) {
    const auto enough = static_cast<std::uint32_t>(std::max<std::size_t>(options_.event_min_match_blocks, 1));
    options_.events->match(request.kv_chain, ranks.size(), matched_);
    last_evidence_ = evidence::events;
    const bool held = std::ranges::any_of(ranks, [&](const rank_view& h) {
      return h.usable && matched_[static_cast<std::size_t>(&h - ranks.data())] >= enough;
    });
    if (!held) {
      // The events' shorter matches still break rule 2's ties; the pending routes may reach the threshold.
      pending_.match(request.kv_chain, ranks.size(), pending_routes::clock::now(), pending_matched_);
      for (std::size_t r = 0; r < ranks.size(); ++r) matched_[r] = std::max(matched_[r], pending_matched_[r]);
      last_evidence_ = evidence::pending;
    }
    return {enough, options_.block_size};
  }
  last_evidence_ = evidence::approximate;
  index_.match(request.prefix_chain, ranks.size(), matched_);
  return {static_cast<std::uint32_t>(std::max<std::size_t>(options_.min_match_blocks, 1)),
          static_cast<std::uint32_t>(prefix_block_tokens)};
}

std::optional<std::size_t> prefix_aware::choose(const pick_context& request, std::span<const rank_view> ranks) {
  const auto [enough, tokens_per_block] = match(request, ranks);
  const auto match_of = [&](const rank_view& h) { return matched_[static_cast<std::size_t>(&h - ranks.data())]; };
  const load_bound bound(ranks, options_.load_bound);
  std::uint32_t best_usable = 0;
  std::uint32_t best_allowed = 0;
  for (const auto& h : ranks) {
    if (!h.usable) continue;
    best_usable = std::max(best_usable, match_of(h));
    if (bound.allows(h)) best_allowed = std::max(best_allowed, match_of(h));
  }
  const auto per_weight = [](const rank_view& h) { return h.inflight / h.weight; };
  std::optional<std::size_t> chosen;
  std::uint32_t matched = 0;
  if (best_allowed >= enough) {
    // Rule 1: where the prefix is.
    chosen = lowest_score(ranks, ties_, per_weight,
                          [&](const rank_view& h) { return bound.allows(h) && match_of(h) == best_allowed; });
    matched = best_allowed;
    if (stats_) stats_->prefix_taken.fetch_add(1, std::memory_order_relaxed);
  } else {
    // Rule 2: least-inflight, its ties to the longer match.
    std::optional<double> fewest;
    for (const auto& h : ranks) {
      if (h.usable && (!fewest || per_weight(h) < *fewest)) fewest = per_weight(h);
    }
    if (!fewest) return std::nullopt;
    std::uint32_t longest = 0;
    for (const auto& h : ranks) {
      if (h.usable && per_weight(h) == *fewest) longest = std::max(longest, match_of(h));
    }
    chosen = lowest_score(ranks, ties_, per_weight, [&](const rank_view& h) { return match_of(h) == longest; });
    if (chosen) matched = matched_[*chosen];
    if (stats_) {
      (best_usable >= enough ? stats_->prefix_overridden : stats_->prefix_missed).fetch_add(1, std::memory_order_relaxed);
    }
  }
  if (!chosen) return std::nullopt;
  if (stats_) stats_->matched_tokens.observe(static_cast<double>(matched) * tokens_per_block);
  index_.insert(*chosen, request.prefix_chain);
  publish_size(*chosen);
  // Placed without the events' evidence: remembered until they can show it (a removal they report for a pick
  // made on their evidence takes effect at once).
  if (last_evidence_ == evidence::pending) pending_.remember(*chosen, request.kv_chain, pending_routes::clock::now());
  return chosen;
}

std::optional<place> prefix_aware::preferred(const pick_context& request, std::span<const rank_view> ranks) {
  if (request.prefix_chain.empty() && request.kv_chain.empty()) return std::nullopt;
  const auto [enough, tokens_per_block] = match(request, ranks);
  const load_bound bound(ranks, options_.load_bound);
  std::optional<std::size_t> best;
  for (std::size_t r = 0; r < ranks.size(); ++r) {
    const auto& h = ranks[r];
    if (!bound.allows(h) || matched_[r] < enough) continue;
    if (!best || matched_[r] > matched_[*best] ||
        (matched_[r] == matched_[*best] && h.inflight / h.weight < ranks[*best].inflight / ranks[*best].weight)) {
      best = r;
    }
  }
  if (!best) return std::nullopt;
  return place{*best, matched_[*best] * tokens_per_block};
}

void prefix_aware::placed(const pick_context& request, const place& at) {
  if (stats_) {
    stats_->prefix_taken.fetch_add(1, std::memory_order_relaxed);
    stats_->matched_tokens.observe(static_cast<double>(at.matched_tokens));
  }
  index_.insert(at.rank, request.prefix_chain);
  publish_size(at.rank);
  // No pending route: the place was judged on the events' evidence (or a pending route already there).
}

void prefix_aware::on_state_change(std::size_t rank, std::uint8_t flags) {
  // A removed rank's engine may be gone or restarted: what dplb remembers of it is no evidence of its cache
  // any more (if the admin adds the same backend back, its ranks start with an empty index).
  if ((flags & rank_flag::removed) != 0) {
    index_.forget(rank);
    pending_.forget(rank);
    publish_size(rank);
  }
}

void prefix_aware::publish_size(std::size_t rank) {
  if (stats_ && rank < stats_->capacity) stats_->index_blocks[rank].store(index_.blocks(rank), std::memory_order_relaxed);
}

}  // namespace dplb::balancer
