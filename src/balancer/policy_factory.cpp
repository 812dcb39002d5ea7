#include "dplb/balancer/policy_factory.hpp"

#include "dplb/balancer/engine_stats.hpp"
#include "dplb/balancer/least_inflight.hpp"
#include "dplb/balancer/least_load.hpp"
#include "dplb/balancer/least_tokens.hpp"
#include "dplb/balancer/random_pick.hpp"
#include "dplb/balancer/round_robin.hpp"

namespace dplb::balancer {

std::unique_ptr<policy> make_policy(std::string_view name, const policy_options& options) {
  if (name == "round-robin") return std::make_unique<round_robin>();
  if (name == "least-inflight") return std::make_unique<least_inflight>();
  if (name == "least-load") return std::make_unique<least_load>(options.kv_weight);
  if (name == "least-tokens") return std::make_unique<least_tokens>();
  if (name == "prefix-aware") return std::make_unique<prefix_aware>(options.prefix, options.stats);
  if (name == "random") return std::make_unique<random_pick>();
  if (name == "engine-stats") return std::make_unique<engine_stats>();
  return nullptr;
}

}  // namespace dplb::balancer
