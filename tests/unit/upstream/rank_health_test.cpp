#include <catch2/catch.hpp>

#include "dplb/upstream/rank_health.hpp"

using namespace dplb::upstream;
using namespace std::chrono_literals;

namespace {
const rank_health::time_point t0{};
}

TEST_CASE("active checks take a rank down after N failures and back after M successes", "[health]") {
  rank_health h({.unhealthy_threshold = 3, .healthy_threshold = 2});
  CHECK(h.usable());
  h.probe_failed();
  h.probe_failed();
  CHECK(h.healthy());  // two failures are not enough
  h.probe_succeeded();  // and a success in between resets the count
  h.probe_failed();
  h.probe_failed();
  CHECK(h.healthy());
  h.probe_failed();
  CHECK_FALSE(h.healthy());
  CHECK_FALSE(h.usable());
  h.probe_succeeded();
  CHECK_FALSE(h.healthy());
  h.probe_failed();  // a failure in between resets the successes
  h.probe_succeeded();
  CHECK_FALSE(h.healthy());
  h.probe_succeeded();
  CHECK(h.healthy());
}

TEST_CASE("consecutive request failures eject a rank for a back-off that doubles", "[health]") {
  rank_health h({.ejection_threshold = 3, .base_ejection = 1000ms, .max_ejection = 3500ms});
  auto now = t0;
  CHECK_FALSE(h.record(request_outcome::server_error, now));
  CHECK_FALSE(h.record(request_outcome::reset, now));
  CHECK_FALSE(h.record(request_outcome::success, now));  // resets the count
  CHECK_FALSE(h.record(request_outcome::connect_failure, now));
  CHECK_FALSE(h.record(request_outcome::connect_failure, now));
  CHECK(h.record(request_outcome::timeout, now));
  CHECK_FALSE(h.usable());
  CHECK(h.ejected_until() == now + 1000ms);

  h.tick(now + 999ms);
  CHECK(h.ejected());
  now += 1000ms;
  h.tick(now);
  CHECK(h.usable());
  // Second ejection: twice as long; third: capped at the maximum.
  for (int i = 0; i < 3; ++i) h.record(request_outcome::server_error, now);
  CHECK(h.ejected_until() == now + 2000ms);
  now += 2000ms;
  h.tick(now);
  for (int i = 0; i < 3; ++i) h.record(request_outcome::server_error, now);
  CHECK(h.ejected_until() == now + 3500ms);
  CHECK(h.times_ejected() == 3);
}

TEST_CASE("an ejection history is forgiven after a clean maximum back-off", "[health]") {
  rank_health h({.ejection_threshold = 1, .base_ejection = 100ms, .max_ejection = 1000ms});
  h.record(request_outcome::reset, t0);
  h.tick(t0 + 100ms);
  h.record(request_outcome::reset, t0 + 200ms);
  CHECK(h.ejected_until() == t0 + 400ms);  // doubled
  h.tick(t0 + 400ms);
  h.record(request_outcome::reset, t0 + 400ms + 1000ms);  // clean for a whole max back-off
  CHECK(h.ejected_until() == t0 + 1500ms);  // back to the base duration
}

TEST_CASE("ejection threshold 0 disables passive ejection, and failures while ejected do not extend it", "[health]") {
  rank_health off({.ejection_threshold = 0});
  for (int i = 0; i < 100; ++i) CHECK_FALSE(off.record(request_outcome::server_error, t0));
  CHECK(off.usable());

  rank_health h({.ejection_threshold = 1, .base_ejection = 100ms});
  CHECK(h.record(request_outcome::server_error, t0));
  CHECK_FALSE(h.record(request_outcome::server_error, t0 + 50ms));
  CHECK(h.ejected_until() == t0 + 100ms);
}

TEST_CASE("a rank both ejected and down is usable only when both have cleared", "[health]") {
  rank_health h({.unhealthy_threshold = 1, .healthy_threshold = 1, .ejection_threshold = 1, .base_ejection = 100ms});
  h.record(request_outcome::reset, t0);
  h.probe_failed();
  h.tick(t0 + 100ms);
  CHECK_FALSE(h.usable());  // ejection over, still down
  h.probe_succeeded();
  CHECK(h.usable());
}

TEST_CASE("a failure that may not eject (too many ranks out) ejects nothing, the next one may", "[health]") {
  rank_health h({.ejection_threshold = 2, .base_ejection = 100ms});
  CHECK_FALSE(h.record(request_outcome::reset, t0, false));
  CHECK_FALSE(h.record(request_outcome::reset, t0, false));
  CHECK(h.usable());
  CHECK(h.record(request_outcome::reset, t0, true));
  CHECK_FALSE(h.usable());
}
