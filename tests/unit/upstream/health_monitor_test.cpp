// The health monitor's passive path, as the sessions drive it: a success skips the lock when its rank
// has no failure streak, and must still reset a streak that exists.

#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dplb/balancer/balancer.hpp"
#include "dplb/balancer/policy_factory.hpp"
#include "dplb/metrics/proxy_metrics.hpp"
#include "dplb/upstream/health_monitor.hpp"

using namespace dplb;
using upstream::request_outcome;

namespace {

std::vector<std::unique_ptr<balancer::policy>> least_inflight_each(std::size_t clusters) {
  std::vector<std::unique_ptr<balancer::policy>> out;
  for (std::size_t c = 0; c < clusters; ++c) out.push_back(balancer::make_policy("least-inflight"));
  return out;
}

struct monitored {
  // rank_clusters[r]: rank r's cluster (all in group 0 by default).
  monitored(std::size_t ranks, upstream::health_policy policy, std::vector<std::size_t> rank_clusters = {})
      : clusters(rank_clusters.empty() ? std::vector<std::size_t>(ranks, 0) : std::move(rank_clusters)),
        balancer(clusters, least_inflight_each(std::ranges::max(clusters) + 1)) {
    for (std::size_t r = 0; r < ranks; ++r) {
      urls.push_back("http://127.0.0.1:" + std::to_string(9000 + r));
      upstream::backend b;
      b.url = urls.back();
      topology.add(std::move(b), 1, clusters[r]);
    }
    metrics.emplace(urls, balancer, "least-inflight");
    health.emplace(topology, balancer, *metrics, upstream::health_check_settings{.interval = std::chrono::milliseconds(0), .policy = policy});
  }
  std::vector<std::string> urls;
  upstream::topology topology;
  std::vector<std::size_t> clusters;
  balancer::balancer balancer;
  std::optional<metrics::proxy_metrics> metrics;
  std::optional<upstream::health_monitor> health;
};

}  // namespace

TEST_CASE("a success resets a rank's failure streak, and only an unbroken streak ejects", "[health]") {
  monitored m(4, {.ejection_threshold = 3});
  auto& health = *m.health;
  health.record(0, request_outcome::success);  // no streak: nothing to do
  health.record(0, request_outcome::server_error);
  health.record(0, request_outcome::reset);
  health.record(0, request_outcome::success);  // breaks the streak
  health.record(0, request_outcome::timeout);
  health.record(0, request_outcome::connect_failure);
  CHECK_FALSE(health.ejected(0));
  CHECK(m.balancer.usable(0));
  health.record(0, request_outcome::server_error);
  CHECK(health.ejected(0));
  CHECK_FALSE(m.balancer.usable(0));
  // Another rank's streak is its own, and a success elsewhere does not break it.
  health.record(1, request_outcome::reset);
  health.record(1, request_outcome::reset);
  health.record(2, request_outcome::success);
  health.record(1, request_outcome::reset);
  CHECK(health.ejected(1));
  // Two of four ranks out is the 50 % cap: a third streak is counted but ejects nothing.
  for (int i = 0; i < 4; ++i) health.record(2, request_outcome::server_error);
  CHECK_FALSE(health.ejected(2));
  CHECK(m.balancer.usable(2));
}

TEST_CASE("the ejection cap counts the ranks of the failing rank's cluster only", "[health][clusters]") {
  // Ranks 0-3 serve one model, rank 4 alone serves another; at most half of a group may be ejected.
  monitored m(5, {.ejection_threshold = 2, .max_ejected_percent = 50}, {0, 0, 0, 0, 1});
  auto& health = *m.health;
  for (int i = 0; i < 4; ++i) health.record(4, request_outcome::server_error);
  CHECK_FALSE(health.ejected(4));  // its group's only rank: never ejected
  for (std::size_t r = 0; r < 4; ++r) {
    for (int i = 0; i < 2; ++i) health.record(r, request_outcome::server_error);
  }
  CHECK(health.ejected(0));
  CHECK(health.ejected(1));
  CHECK_FALSE(health.ejected(2));  // half of the group is out already
  CHECK_FALSE(health.ejected(3));
}
