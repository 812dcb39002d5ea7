#include "dplb/support/atomic_histogram.hpp"

#include <algorithm>
#include <limits>

namespace dplb::support {

atomic_histogram::atomic_histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), counts_(std::make_unique<std::atomic<std::uint64_t>[]>(bounds_.size() + 1)) {
  std::sort(bounds_.begin(), bounds_.end());
}

void atomic_histogram::observe(double value) noexcept {
  // Prometheus buckets are "less than or equal": the first bound not below the value.
  const auto bucket = std::lower_bound(bounds_.begin(), bounds_.end(), value) - bounds_.begin();
  counts_[static_cast<std::size_t>(bucket)].fetch_add(1, std::memory_order_relaxed);
  sum_.fetch_add(value, std::memory_order_relaxed);
}

prometheus::ClientMetric::Histogram atomic_histogram::snapshot() const {
  prometheus::ClientMetric::Histogram out;
  out.bucket.reserve(bounds_.size() + 1);
  std::uint64_t cumulative = 0;
  for (std::size_t i = 0; i <= bounds_.size(); ++i) {
    cumulative += counts_[i].load(std::memory_order_relaxed);
    prometheus::ClientMetric::Bucket bucket;
    bucket.cumulative_count = cumulative;
    bucket.upper_bound = i < bounds_.size() ? bounds_[i] : std::numeric_limits<double>::infinity();
    out.bucket.push_back(bucket);
  }
  out.sample_count = cumulative;
  out.sample_sum = sum_.load(std::memory_order_relaxed);
  return out;
}

}  // namespace dplb::support
