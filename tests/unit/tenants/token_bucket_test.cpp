// A tenant's rate limit: a full bucket lets a burst through, then one unit a 1/rate; the refill stops at the
// burst; a refusal says how long to wait, to the clock's tick and in Retry-After seconds; a cost above the
// burst is refused for good; and a time earlier than one already seen mints nothing.
#include <catch2/catch.hpp>

#include <chrono>
#include <limits>
#include <stdexcept>

#include "dplb/tenants/token_bucket.hpp"

using namespace dplb::tenants;
using namespace std::chrono_literals;

namespace {

const token_bucket::clock::time_point t0 = token_bucket::clock::time_point{} + 1000s;

}  // namespace

TEST_CASE("token bucket: starts full, lets a burst through, then refills at the rate", "[tenants]") {
  token_bucket bucket(2.0, 4);
  for (int i = 0; i < 4; ++i) CHECK(bucket.try_take(t0));
  CHECK_FALSE(bucket.try_take(t0));
  CHECK_FALSE(bucket.try_take(t0 + 499ms));
  CHECK(bucket.try_take(t0 + 500ms));  // 2 a second: one unit every 500 ms
  CHECK_FALSE(bucket.try_take(t0 + 500ms));
  CHECK(bucket.try_take(t0 + 1500ms, 2));  // a second later, two more
  CHECK_FALSE(bucket.try_take(t0 + 1500ms));
}

TEST_CASE("token bucket: the refill stops at the burst, however long the bucket stays unused", "[tenants]") {
  token_bucket bucket(10.0, 3);
  for (int i = 0; i < 3; ++i) REQUIRE(bucket.try_take(t0));
  const auto later = t0 + 1h;
  for (int i = 0; i < 3; ++i) CHECK(bucket.try_take(later));
  CHECK_FALSE(bucket.try_take(later));
}

TEST_CASE("token bucket: the default burst is one second's worth, rounded up, at least 1", "[tenants]") {
  CHECK(token_bucket(5.0).burst() == 5u);
  CHECK(token_bucket(2.5).burst() == 3u);
  CHECK(token_bucket(0.5).burst() == 1u);
}

TEST_CASE("token bucket: a refusal says how long until the units are there", "[tenants]") {
  token_bucket bucket(4.0, 2);
  REQUIRE(bucket.try_take(t0, 2));
  CHECK(bucket.retry_after(t0) == 250ms);
  CHECK(bucket.retry_after(t0, 2) == 500ms);
  CHECK(bucket.retry_after(t0 + 125ms) == 125ms);
  CHECK(bucket.retry_after(t0 + 250ms) == 0ms);  // there now
  CHECK(bucket.retry_after(t0 + 1s, 2) == 0ms);
  CHECK_FALSE(bucket.try_take(t0 + 125ms));
  CHECK(bucket.try_take(t0 + 125ms + *bucket.retry_after(t0 + 125ms)));
}

TEST_CASE("token bucket: a wait that is not a whole number of ticks is rounded up, and taking then succeeds",
          "[tenants]") {
  token_bucket bucket(3.0, 1);
  REQUIRE(bucket.try_take(t0));
  const auto wait = bucket.retry_after(t0);
  REQUIRE(wait);
  CHECK(*wait == 333'333'334ns);  // 1/3 s, up to the next nanosecond
  CHECK_FALSE(bucket.try_take(t0 + *wait - 1ns));
  CHECK(bucket.try_take(t0 + *wait));
}

TEST_CASE("token bucket: Retry-After seconds are the wait rounded up, at least 1", "[tenants]") {
  CHECK(retry_after_seconds(0ms) == 1);
  CHECK(retry_after_seconds(1ns) == 1);
  CHECK(retry_after_seconds(1s) == 1);
  CHECK(retry_after_seconds(1s + 1ns) == 2);
  CHECK(retry_after_seconds(2500ms) == 3);
  token_bucket bucket(0.5, 1);  // one every 2 s
  REQUIRE(bucket.try_take(t0));
  CHECK(retry_after_seconds(*bucket.retry_after(t0 + 500ms)) == 2);  // 1.5 s
}

TEST_CASE("token bucket: a cost above the burst never succeeds, and retry_after says never", "[tenants]") {
  token_bucket bucket(100.0, 10);
  CHECK_FALSE(bucket.try_take(t0, 11));
  CHECK_FALSE(bucket.try_take(t0 + 1h, 11));
  CHECK_FALSE(bucket.retry_after(t0, 11).has_value());
  CHECK(bucket.try_take(t0, 10));  // the refused cost took nothing: the whole burst is still there
}

TEST_CASE("token bucket: a time earlier than one already seen mints no units", "[tenants]") {
  token_bucket bucket(1.0, 2);
  REQUIRE(bucket.try_take(t0 + 10s, 2));
  // Earlier than the last take: taken as that time, so the bucket is still empty.
  CHECK_FALSE(bucket.try_take(t0));
  CHECK(bucket.retry_after(t0) == 1s);  // as from t0 + 10s
  CHECK_FALSE(bucket.try_take(t0 + 5s));
  // And a stale time leaves the refill where it was: one unit a second from t0 + 10s.
  CHECK_FALSE(bucket.try_take(t0 + 10s + 500ms));
  CHECK(bucket.try_take(t0 + 11s));
  // A refused take at a later time moves the time seen on too: going back to t0 + 11s finds nothing more.
  CHECK_FALSE(bucket.try_take(t0 + 11s + 500ms));
  CHECK_FALSE(bucket.try_take(t0 + 11s));
  CHECK(bucket.try_take(t0 + 12s));
}

TEST_CASE("token bucket: per minute, a minute's worth deep by default", "[tenants]") {
  auto tokens = token_bucket::per_minute(600.0);  // 10 a second
  CHECK(tokens.burst() == 600u);
  CHECK(tokens.rate() == 10.0);
  CHECK(tokens.try_take(t0, 600));
  CHECK_FALSE(tokens.try_take(t0, 1));
  CHECK(tokens.retry_after(t0, 50) == 5s);
  auto shallow = token_bucket::per_minute(60.0, 5);
  CHECK(shallow.burst() == 5u);
  CHECK(shallow.try_take(t0, 5));
  CHECK(shallow.retry_after(t0, 1) == 1s);
}

TEST_CASE("token bucket: a rate that is no rate, a burst of 0 or a year-long refill are refused", "[tenants]") {
  CHECK_THROWS_AS(token_bucket(0.0), std::invalid_argument);
  CHECK_THROWS_AS(token_bucket(-1.0, 1), std::invalid_argument);
  CHECK_THROWS_AS(token_bucket(std::numeric_limits<double>::quiet_NaN(), 1), std::invalid_argument);
  CHECK_THROWS_AS(token_bucket(std::numeric_limits<double>::infinity()), std::invalid_argument);
  CHECK_THROWS_WITH(token_bucket(1.0, 0), Catch::Contains("burst must be at least 1"));
  CHECK_THROWS_WITH(token_bucket(1e-6, 1'000'000), Catch::Contains("more than a year"));
  CHECK_THROWS_AS(token_bucket::per_minute(0.0), std::invalid_argument);
}

TEST_CASE("token bucket: an unused reservation comes back, never above the burst", "[tenants]") {
  token_bucket bucket(1.0, 10);
  REQUIRE(bucket.try_take(t0, 8));
  CHECK(bucket.missing(t0) == 8);
  bucket.give_back(5);
  CHECK(bucket.missing(t0) == 3);
  CHECK(bucket.try_take(t0, 7));
  CHECK_FALSE(bucket.try_take(t0, 1));
  bucket.give_back(100);
  CHECK(bucket.missing(t0) == 0);
  CHECK_FALSE(bucket.try_take(t0, 11));
}

TEST_CASE("token bucket: use beyond a reservation is charged into debt, at most one burst deep", "[tenants]") {
  token_bucket bucket(1.0, 10);
  REQUIRE(bucket.try_take(t0, 10));
  bucket.charge(t0, 4);  // the engine reported 4 more than reserved
  CHECK(bucket.missing(t0) == 14);
  // Nothing passes until the debt is paid: 4 s to empty, then 1 s for one unit.
  CHECK_FALSE(bucket.try_take(t0 + 4s, 1));
  CHECK(bucket.try_take(t0 + 5s, 1));
  bucket.charge(t0 + 5s, 1000);
  CHECK(bucket.missing(t0 + 5s) == 20);  // the debt stops at one burst
  CHECK(bucket.retry_after(t0 + 5s, 1) == std::chrono::seconds(11));
}
