#pragma once
// Feeds the engine-stats baseline policy: every --stats-interval it reads each engine's /metrics, takes
// vllm:num_requests_waiting and vllm:num_requests_running, and publishes the snapshot of all ranks to
// the balancer at once, as vLLM's DP coordinator publishes to its clients. Started only when the chosen
// policy asks for engine stats; dplb's own policies never need it.
//
// Threading contract: the poll loop runs on one executor, given to start(); stop() may be called from
// any thread.

#include <atomic>
#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>
#include <chrono>
#include <vector>

#include "dplb/balancer/policy.hpp"
#include "dplb/upstream/backend.hpp"
#include "dplb/upstream/engine_metrics_parser.hpp"  // parse_engine_load

namespace dplb::balancer {
class balancer;
}

namespace dplb::upstream {

class engine_stats_poller {
 public:
  engine_stats_poller(const std::vector<backend>& backends, balancer::balancer& balancer,
                      std::chrono::milliseconds interval, std::chrono::milliseconds timeout);

  void start(const boost::asio::any_io_executor& executor);
  void stop() noexcept { stopped_.store(true, std::memory_order_relaxed); }

 private:
  boost::asio::awaitable<void> poll_loop();

  const std::vector<backend>& backends_;
  balancer::balancer& balancer_;
  std::chrono::milliseconds interval_;
  std::chrono::milliseconds timeout_;
  std::atomic<bool> stopped_{false};
};

}  // namespace dplb::upstream
