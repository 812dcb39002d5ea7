#pragma once
#include "dplb/balancer/policy.hpp"

namespace dplb::balancer {

// dplb's exact counts, raised by what the engines report: the usable rank with the lowest
//   load = inflight + max(0, running + waiting - inflight_at_read) + kv_weight * waiting * max(0, kv - 0.5)
// per unit of weight (load / weight), ties to the `rotation`.
// vLLM's own balancer scores max(inflight, running + waiting) + the same KV term. Its max() trusts a read
// that is up to an interval old as much as its live count; here the read only tells what dplb cannot
// count itself: the requests the engine had beyond the most of dplb's own it can have counted (those in
// flight there when the read left, plus every pick until its answer came back; engine_stats_poller):
// work from another dplb replica, clients that bypass dplb, a queue behind long prefills. dplb's
// own requests are its live count, so every pick since the read counts and every release since counts
// too: a burst on idle ranks stays exact whatever reads land in it, and a request that finished a moment
// ago weighs nothing, where "picks since the read" would still count it until the next read. When the
// engine reports no more than dplb had in flight, the two scores agree. Stale or missing stats leave the
// in-flight count alone: least-inflight.
// The KV term avoids a rank whose KV cache is over half full while requests wait there: they wait for
// memory, and more would only wait longer.
class least_load final : public policy {
 public:
  explicit least_load(double kv_weight = 6.0) : kv_weight_(kv_weight) {}
  std::optional<std::size_t> choose(const pick_context& request, std::span<const rank_view> ranks) override;
  std::string_view name() const noexcept override { return "least-load"; }
  bool uses_engine_stats() const noexcept override { return true; }

  // The load of one rank as this policy scores it, before the weight (for tests and /ranks).
  double load_of(const rank_view& rank) const noexcept;
  // With a shared ledger: the engine's requests running and waiting, and the KV term, when fresh. Every
  // replica's requests are then the live count, and what the engine reports beyond them raises it.
  double engine_floor(const rank_view& rank) const noexcept override;

 private:
  double kv_weight_;
  rotation ties_;
};

}  // namespace dplb::balancer
