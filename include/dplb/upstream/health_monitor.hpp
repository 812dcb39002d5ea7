#pragma once
// Keeps the balancer's unhealthy and ejected flags of every rank in line with the rank's health: active
// probes of GET /health (one per backend: the DP ranks behind one URL share its API server, so one probe
// speaks for all of them), and the outcomes of real requests reported by the sessions (passive outlier
// ejection, per rank). See rank_health.hpp for the rules. It owns only those two flags: a drain set by
// the admin API is never undone by a probe.
//
// Every backend is probed on a timer of its own, as Envoy's per-host health checkers are: its probes do
// not wait for other backends' probes, so N backends that never answer cost one probe timeout per round,
// not N. A probe starts one interval after the previous one started, less a random jitter of up to a
// tenth of the interval (so that the probes of many backends, or of several dplb replicas, drift apart
// instead of arriving together), or as soon as the previous one ends if it took longer; the first starts
// within a tenth of an interval of start(). So a backend that stops answering is marked down within
// unhealthy_threshold x max(interval, timeout) + timeout, and one that never answered, counted from
// start(), within unhealthy_threshold x (interval + timeout), however many backends there are.
//
// Threading contract: record() may be called from any thread; a success on a rank with no failure
// streak (nearly every request) is one atomic load, anything else takes a short lock. The probe and
// tick loops run on one executor, given to start(); dplb gives it a thread of its own, off the request
// workers.

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "dplb/upstream/backend.hpp"
#include "dplb/upstream/rank_health.hpp"

namespace dplb::balancer {
class balancer;
}
namespace dplb::metrics {
class proxy_metrics;
}
namespace dplb::support {
class supervisor;
}

namespace dplb::upstream {

struct health_check_settings {
  std::chrono::milliseconds interval{2'000};  // 0 disables active checks
  std::chrono::milliseconds timeout{1'000};   // per probe: connect + answer
  std::string path = "/health";
  health_policy policy;
};

class health_monitor {
 public:
  health_monitor(const topology& topology, balancer::balancer& balancer,
                 metrics::proxy_metrics& metrics, health_check_settings settings);

  // Hosts added to the topology since (any thread, one at a time): their health starts fresh, good.
  void add_ranks();
  // A rank whose backend was added again after a removal starts over: healthy, no ejection history.
  void restart(std::size_t rank);

  // A request's outcome on a rank (any thread). May eject the rank.
  void record(std::size_t rank, request_outcome outcome);

  // Starts the probes (if enabled: one timer per backend, backends added later included) and the
  // ejection timer loop on the executor, supervised (task health).
  void start(const boost::asio::any_io_executor& executor, support::supervisor& supervisor);
  void stop();  // any thread

  bool healthy(std::size_t rank) const;
  bool ejected(std::size_t rank) const;

 private:
  boost::asio::awaitable<void> probe_loop();  // starts a backend_probe_loop per backend, as they come
  boost::asio::awaitable<void> backend_probe_loop(const backend& target);
  boost::asio::awaitable<void> tick_loop();
  boost::asio::awaitable<bool> probe(const backend& target);
  void apply(std::size_t rank);  // pushes the rank's flags to the balancer; lock held
  bool removed(std::size_t rank) const;  // its backend was removed: nothing to check
  void record_probe(const backend& target, bool ok);  // lock held

  const topology& topology_;
  balancer::balancer& balancer_;
  metrics::proxy_metrics& metrics_;
  health_check_settings settings_;
  mutable std::mutex mutex_;
  std::vector<rank_health> ranks_;
  // ranks_[r].consecutive_errors(), readable without mutex_ (see record()). A line per rank: every
  // request's outcome reads its rank's, and failures on one rank write it.
  struct alignas(64) failure_streak {
    std::atomic<std::uint32_t> count{0};
  };
  std::unique_ptr<failure_streak[]> streaks_;  // for the topology's capacity: record() reads them unlocked
  std::atomic<bool> stopped_{false};  // the loops end at their next step
  support::supervisor* supervisor_ = nullptr;  // set by start(): restarts a backend's probe loop that threw
  std::size_t probe_loops_ = 0;  // backends with a probe loop; the side-channel thread's (kept across restarts)
};

}  // namespace dplb::upstream
