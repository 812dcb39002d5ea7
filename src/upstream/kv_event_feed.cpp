#include "dplb/upstream/kv_event_feed.hpp"

namespace dplb::upstream {

std::vector<kv::event_source> kv_event_sources(const topology& topology, const balancer::balancer& balancer) {
  std::vector<kv::event_source> out;
  const auto backends = topology.backends();
  for (const auto& r : topology.ranks()) {
    const backend& b = backends[r.backend];
    if (!b.kv_events || r.rank >= balancer.rank_count() || (balancer.flags(r.rank) & balancer::rank_flag::removed) != 0) {
      continue;
    }
    out.push_back({r.rank, b.kv_events->for_rank(r.rank_in_url), b.kv_replay ? b.kv_replay->for_rank(r.rank_in_url) : ""});
  }
  return out;
}

void kv_event_feed::refresh() {
  auto sources = kv_event_sources(topology_, balancer_);
  // Shown in the metrics from now on, before the subscriber's thread has opened the socket (it clears the
  // mark of a rank that loses its source).
  for (const auto& source : sources) index_.set_configured(source.rank, true);
  subscriber_.set_sources(std::move(sources));
  const std::size_t ranks = std::min(topology_.ranks().size(), balancer_.rank_count());
  unhealthy_.resize(ranks, false);
  for (std::size_t r = 0; r < ranks; ++r) {
    const bool unhealthy = (balancer_.flags(r) & balancer::rank_flag::unhealthy) != 0;
    if (unhealthy && !unhealthy_[r]) {
      index_.clear_rank(r, kv::reset_reason::unhealthy);
      subscriber_.resync(r);  // what the engine still buffers is caught up on, when it speaks again
    }
    unhealthy_[r] = unhealthy;
  }
}

}  // namespace dplb::upstream
