#include <catch2/catch.hpp>

#include <prometheus/histogram.h>
#include <limits>
#include <thread>
#include <vector>

#include "dplb/support/atomic_histogram.hpp"

using dplb::support::atomic_histogram;

TEST_CASE("atomic_histogram counts as prometheus-cpp's Histogram does", "[support]") {
  const std::vector<double> bounds{0.001, 0.01, 0.1, 1, 10};
  atomic_histogram ours(bounds);
  prometheus::Histogram theirs(bounds);
  for (double v : {0.0, 0.001, 0.0011, 0.05, 0.1, 0.5, 1.0, 9.99, 10.0, 11.0, 1e9, -1.0}) {
    ours.observe(v);
    theirs.Observe(v);
  }
  const auto a = ours.snapshot();
  const auto b = theirs.Collect().histogram;
  REQUIRE(a.bucket.size() == b.bucket.size());
  for (std::size_t i = 0; i < a.bucket.size(); ++i) {
    CHECK(a.bucket[i].cumulative_count == b.bucket[i].cumulative_count);
    CHECK(a.bucket[i].upper_bound == b.bucket[i].upper_bound);
  }
  CHECK(a.bucket.back().upper_bound == std::numeric_limits<double>::infinity());
  CHECK(a.sample_count == b.sample_count);
  CHECK(a.sample_sum == Approx(b.sample_sum));
}

TEST_CASE("atomic_histogram loses no observation across threads", "[support]") {
  atomic_histogram h({1, 2, 3});
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&h, t] {
      for (int i = 0; i < 20'000; ++i) h.observe(t);  // 0, 1, 2, 3: one bucket each
    });
  }
  for (auto& t : threads) t.join();
  const auto s = h.snapshot();
  CHECK(s.sample_count == 80'000);
  CHECK(s.bucket[0].cumulative_count == 40'000);  // 0 and 1 are both <= 1
  CHECK(s.bucket[1].cumulative_count == 60'000);
  CHECK(s.bucket[2].cumulative_count == 80'000);
  CHECK(s.sample_sum == Approx(20'000.0 * (0 + 1 + 2 + 3)));
}
