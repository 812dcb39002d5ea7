#pragma once
#include "dplb/balancer/policy.hpp"

namespace dplb::balancer {

// dplb's exact counts, raised by what the engines report: the usable rank with the lowest
//   load = max(inflight, running + waiting + picks_since_read) + kv_weight * waiting * max(0, kv - 0.5)
// per unit of weight once it takes this request ((load + 1) / weight), ties in rotation. This is vLLM's
// own score (2026-07), with one change that keeps bursts exact: the engine's numbers are from a read
// up to an interval old, so dplb adds the picks it made since that read, and it never trusts them below
// its own in-flight count. Stats can therefore only raise a rank's load (work that reached it through
// another dplb replica or straight from a client, a queue behind long prefills), never hide a request
// dplb knows it sent. Stale or missing stats leave the in-flight count alone: least-inflight.
// The second term avoids a rank whose KV cache is over half full while requests wait there: they wait
// for memory, and more would only wait longer.
class least_load final : public policy {
 public:
  explicit least_load(double kv_weight = 6.0) : kv_weight_(kv_weight) {}
  std::optional<std::size_t> choose(const pick_context& request, std::span<const host_view> hosts) override;
  std::string_view name() const noexcept override { return "least-load"; }
  bool uses_engine_stats() const noexcept override { return true; }

  // The load of one host as this policy scores it, before the weight (for tests and /ranks).
  double load_of(const host_view& host) const noexcept;

 private:
  double kv_weight_;
  std::size_t next_ = 0;
};

}  // namespace dplb::balancer
