#pragma once
// The load-balancing policy interface. A policy only chooses; the balancer owns the counts.
//
// Threading contract: the balancer calls choose() with its lock held, so a policy needs no
// synchronisation of its own and may keep state (a rotation cursor, a stats snapshot) in plain members.
// choose() must be fast and must not block: it runs once per request on the proxy's hot path.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>

namespace dplb::balancer {

// One rank's load as its engine reports it (vLLM's /metrics gauges), for the engine-stats baseline.
struct engine_load {
  std::uint32_t waiting = 0;  // vllm:num_requests_waiting
  std::uint32_t running = 0;  // vllm:num_requests_running
};

// What a policy sees of one rank when it chooses.
struct rank_view {
  std::uint32_t inflight = 0;  // requests dplb has sent to this rank and not yet finished
  bool usable = true;          // false: down or ejected; never choose it
};

class policy {
 public:
  virtual ~policy() = default;

  // Returns the index of the rank to send the next request to, or nullopt when no rank is usable.
  // `ranks` is indexed by rank and holds the state just before this pick.
  virtual std::optional<std::size_t> choose(std::span<const rank_view> ranks) = 0;

  // The name used on the command line and in logs, e.g. "round-robin".
  virtual std::string_view name() const noexcept = 0;

  // Policies fed by engine stats say so; dplb then polls every engine's /metrics and hands each full
  // snapshot (indexed by rank) to on_engine_stats(), under the same lock as choose().
  virtual bool uses_engine_stats() const noexcept { return false; }
  virtual void on_engine_stats(std::span<const engine_load> /*snapshot*/) {}
};

}  // namespace dplb::balancer
