#pragma once
// A rate limit as a token bucket: `rate` units come back each second, up to `burst` in store, and a request
// takes `cost` of them or is refused. The unit is whatever the caller counts: one per request for a request
// rate, a request's tokens for a token rate. Rates are per second; per_minute() converts a per-minute limit
// (tokens per minute are usually given that way) and stores a minute's worth by default.
//
// The caller passes the time in, so that tests need no sleeping and one clock read serves a whole admission.
// Time never runs backwards here: a `now` earlier than the latest one seen is taken as that latest one (two
// threads may read the clock in one order and take the queue's lock in the other), so it never mints tokens.
//
// Not thread-safe: its owner (the admission queue) calls it under its own lock.

#include <chrono>
#include <cstdint>
#include <optional>

namespace dplb::tenants {

class token_bucket {
 public:
  using clock = std::chrono::steady_clock;

  // `rate` units a second, `burst` deep, full until the first take. Throws std::invalid_argument unless
  // the rate is finite and above 0 and the burst at least 1, or if an empty bucket would take more than a
  // year to refill (surely a mistake, and it keeps every wait within clock::duration).
  token_bucket(double rate, std::uint64_t burst);
  // As deep as one second's worth: ceil(rate), at least 1.
  explicit token_bucket(double rate);
  // `units` a minute, `burst` deep; by default a minute's worth, ceil(units), at least 1.
  static token_bucket per_minute(double units, std::optional<std::uint64_t> burst = std::nullopt);

  // Takes `cost` units if the bucket holds them; whether it did. A cost above the burst never succeeds.
  bool try_take(clock::time_point now, std::uint64_t cost = 1);
  // How long from `now` until `cost` units are there (zero if they are now); nullopt if never, because the
  // cost is above the burst: waiting would not help, the request is too large for this limit.
  std::optional<clock::duration> retry_after(clock::time_point now, std::uint64_t cost = 1) const;

  // Units a reservation did not use, back in the bucket (never above the burst).
  void give_back(std::uint64_t units);
  // Units used beyond a reservation, taken whether or not they are there: the bucket may go below empty,
  // down to one burst in debt, and takes nothing more until it has refilled past that.
  void charge(clock::time_point now, std::uint64_t units);
  // The units missing to a full bucket at `now` (a debt included): what a replacement bucket inherits.
  std::uint64_t missing(clock::time_point now) const;

  double rate() const { return rate_; }
  std::uint64_t burst() const { return burst_; }

 private:
  double available(clock::time_point now) const;

  double rate_;
  std::uint64_t burst_;
  double tokens_;
  // The latest time seen by try_take. Meaningful only once a take left the bucket below full: until then
  // available() answers `burst_` without reading it, so its initial minimum never enters a subtraction.
  clock::time_point updated_ = clock::time_point::min();
};

// A wait as a Retry-After header's whole seconds: rounded up, so that a client that waits that long finds
// the units there, and at least 1, since 0 would invite an immediate retry.
std::int64_t retry_after_seconds(token_bucket::clock::duration wait);

}  // namespace dplb::tenants
