#pragma once
// A Prometheus histogram that any thread may observe into without a lock. prometheus-cpp's Histogram
// takes a mutex on every Observe(); on the request path, with every worker thread recording into the same
// per-rank histograms, that lock is shared by all of them. Here each observation is two relaxed atomic
// additions (its bucket and the sum) and a scrape reads them; a scrape that races an observation may see
// its count without its sum for an instant, which Prometheus tolerates (rates are computed over many
// seconds).

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include <prometheus/client_metric.h>

namespace dplb::support {

class atomic_histogram {
 public:
  // `bounds`: the buckets' upper bounds, ascending; a +Inf bucket is implied, as in Prometheus.
  explicit atomic_histogram(std::vector<double> bounds);

  void observe(double value) noexcept;

  // The current counts, cumulative per bucket as Prometheus expects, with the sum and the count.
  prometheus::ClientMetric::Histogram snapshot() const;

 private:
  std::vector<double> bounds_;
  std::unique_ptr<std::atomic<std::uint64_t>[]> counts_;  // per bucket, not cumulative; the last is +Inf
  std::atomic<double> sum_{0.0};
};

}  // namespace dplb::support
