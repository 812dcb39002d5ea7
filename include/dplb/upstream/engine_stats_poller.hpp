#pragma once
// Reads every backend's /metrics each --stats-interval, all backends at once, and publishes one round of
// every rank's running, waiting and KV-cache numbers to the balancer together, as vLLM's DP coordinator
// publishes to its clients. A `#dp=N` backend's page holds its N engines' series. Started only when the
// interval is not 0 (by default: only for a policy that balances on engine stats).
//
// Threading contract: the poll loop and its readers run on one executor, given to start() (dplb gives it
// the side-channel thread, so a page's parse never runs on a request worker); stop() may be called from any
// thread.

#include <atomic>
#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <vector>

#include "dplb/balancer/balancer.hpp"
#include "dplb/upstream/backend.hpp"
#include "dplb/upstream/engine_metrics_parser.hpp"

namespace dplb::support {
class supervisor;
}

namespace dplb::upstream {

class engine_stats_poller {
 public:
  engine_stats_poller(const topology& topology, balancer::balancer& balancer, std::chrono::milliseconds interval,
                      std::chrono::milliseconds timeout);

  // Starts the poll loop on the executor, supervised (task engine_stats).
  void start(const boost::asio::any_io_executor& executor, support::supervisor& supervisor);
  void stop() noexcept { stopped_.store(true, std::memory_order_relaxed); }

 private:
  boost::asio::awaitable<void> poll_loop();
  // Reads one backend's page into its ranks' slots of `round`.
  boost::asio::awaitable<void> read_backend(const backend& target, std::vector<balancer::engine_reading>& round);
  // Fills the readings of the backend's ranks from its /metrics page; false when the page had no numbers.
  bool readings_from_page(const backend& target, std::string_view page, std::vector<balancer::engine_reading>& round) const;

  const topology& topology_;
  balancer::balancer& balancer_;
  std::chrono::milliseconds interval_;
  std::chrono::milliseconds timeout_;
  std::vector<char> warned_;  // per backend: its failure was logged (once, until it answers again)
  std::atomic<bool> stopped_{false};
};

}  // namespace dplb::upstream
