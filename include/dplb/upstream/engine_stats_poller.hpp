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
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <optional>
#include <string_view>
#include <vector>

#include "dplb/balancer/balancer.hpp"
#include "dplb/upstream/backend.hpp"

namespace dplb::upstream {

// The waiting and running counts in a vLLM /metrics page (Prometheus text), each summed over all its
// series (one per engine label and model). nullopt when the page has neither gauge, e.g. an engine run
// with --disable-log-stats.
std::optional<balancer::engine_load> parse_engine_load(std::string_view prometheus_text);

class engine_stats_poller {
 public:
  engine_stats_poller(const topology& topology, balancer::balancer& balancer, std::chrono::milliseconds interval,
                      std::chrono::milliseconds timeout);

  void start(const boost::asio::any_io_executor& executor);
  void stop() noexcept { stopped_.store(true, std::memory_order_relaxed); }

 private:
  boost::asio::awaitable<void> poll_loop();
  // Reads one backend's page into its ranks' slots of `round`; then counts itself done.
  boost::asio::awaitable<void> read_backend(const backend& target, std::vector<balancer::engine_reading>& round,
                                            std::size_t& pending, boost::asio::steady_timer& all_done);
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
