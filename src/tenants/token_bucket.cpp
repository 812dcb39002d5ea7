#include "dplb/tenants/token_bucket.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace dplb::tenants {

namespace {

// Past this an empty bucket's refill is surely a misconfiguration; it also bounds every wait well within
// clock::duration (nanoseconds in 64 bits: about 292 years).
constexpr double max_refill_seconds = 365.0 * 24 * 3600;

void check_rate(double rate) {
  if (!std::isfinite(rate) || rate <= 0) {
    throw std::invalid_argument(fmt::format("a rate limit must be a finite number above 0, not {}", rate));
  }
}

std::uint64_t one_period(double units) {
  check_rate(units);
  // A rate past 2^63 is no limit in effect; the cap keeps the conversion to an integer defined.
  return static_cast<std::uint64_t>(std::min(std::max(std::ceil(units), 1.0), 0x1p63));
}

}  // namespace

token_bucket::token_bucket(double rate, std::uint64_t burst)
    : rate_(rate), burst_(burst), tokens_(static_cast<double>(burst)) {
  check_rate(rate);
  if (burst == 0) throw std::invalid_argument("a rate limit's burst must be at least 1");
  if (static_cast<double>(burst) / rate > max_refill_seconds) {
    throw std::invalid_argument(fmt::format(
        "a burst of {} at {} a second takes more than a year to refill: raise the rate or lower the burst", burst,
        rate));
  }
}

token_bucket::token_bucket(double rate) : token_bucket(rate, one_period(rate)) {}

token_bucket token_bucket::per_minute(double units, std::optional<std::uint64_t> burst) {
  return token_bucket(units / 60.0, burst ? *burst : one_period(units));
}

double token_bucket::available(clock::time_point now) const {
  const auto full = static_cast<double>(burst_);
  if (tokens_ >= full || now <= updated_) return tokens_;
  const double refilled = std::chrono::duration<double>(now - updated_).count() * rate_;
  return std::min(full, tokens_ + refilled);
}

bool token_bucket::try_take(clock::time_point now, std::uint64_t cost) {
  tokens_ = available(now);
  updated_ = std::max(updated_, now);
  const auto wanted = static_cast<double>(cost);
  if (cost > burst_ || tokens_ < wanted) return false;
  tokens_ -= wanted;
  return true;
}

std::optional<token_bucket::clock::duration> token_bucket::retry_after(clock::time_point now,
                                                                       std::uint64_t cost) const {
  if (cost > burst_) return std::nullopt;
  const double missing = static_cast<double>(cost) - available(now);
  if (missing <= 0) return clock::duration::zero();
  // Rounded up to the clock's tick, so that a take at now + the wait finds the units there.
  return std::chrono::ceil<clock::duration>(std::chrono::duration<double>(missing / rate_));
}

void token_bucket::give_back(std::uint64_t units) {
  tokens_ = std::min(static_cast<double>(burst_), tokens_ + static_cast<double>(units));
}

void token_bucket::charge(clock::time_point now, std::uint64_t units) {
  tokens_ = available(now);
  updated_ = std::max(updated_, now);
  tokens_ = std::max(-static_cast<double>(burst_), tokens_ - static_cast<double>(units));
}

std::uint64_t token_bucket::missing(clock::time_point now) const {
  return static_cast<std::uint64_t>(std::ceil(std::max(0.0, static_cast<double>(burst_) - available(now))));
}

std::int64_t retry_after_seconds(token_bucket::clock::duration wait) {
  return std::max<std::int64_t>(1, std::chrono::ceil<std::chrono::seconds>(wait).count());
}

}  // namespace dplb::tenants
