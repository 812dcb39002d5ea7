#pragma once
// Private to the metrics: the pieces of a family assembled at scrape time, outside prometheus-cpp's registry
// (dplb's lock-free histograms, counters read from atomics elsewhere).

#include <prometheus/client_metric.h>
#include <prometheus/histogram.h>
#include <prometheus/metric_family.h>

#include <string>
#include <utility>
#include <vector>

#include "dplb/support/atomic_histogram.hpp"

namespace dplb::metrics {

// LLM latencies span milliseconds (a cached short prompt) to minutes (a long generation queued behind
// others); the buckets cover both ends.
inline prometheus::Histogram::BucketBoundaries latency_buckets() {
  return {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1,   2.5,
          5,     10,     20,    30,   60,    120,  300, 600, 1200, 1800, 3600};
}

// A family assembled at scrape time, outside the registry (lock-free histograms, routing counters).
inline prometheus::MetricFamily scraped_family(std::string name, std::string help, prometheus::MetricType type) {
  prometheus::MetricFamily f;
  f.name = std::move(name);
  f.help = std::move(help);
  f.type = type;
  return f;
}

inline prometheus::ClientMetric histogram_sample(std::vector<prometheus::ClientMetric::Label> labels,
                                                 const support::atomic_histogram& h) {
  prometheus::ClientMetric m;
  m.label = std::move(labels);
  m.histogram = h.snapshot();
  return m;
}

}  // namespace dplb::metrics
