#include "dplb/upstream/engine_stats_poller.hpp"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <spdlog/spdlog.h>

#include "dplb/balancer/balancer.hpp"
#include "dplb/upstream/http_fetch.hpp"

namespace dplb::upstream {

namespace asio = boost::asio;

engine_stats_poller::engine_stats_poller(const std::vector<backend>& backends, balancer::balancer& balancer,
                                         std::chrono::milliseconds interval, std::chrono::milliseconds timeout)
    : backends_(backends), balancer_(balancer), interval_(interval), timeout_(timeout) {}

void engine_stats_poller::start(const asio::any_io_executor& executor) {
  asio::co_spawn(executor, poll_loop(), asio::detached);
}

asio::awaitable<void> engine_stats_poller::poll_loop() {
  asio::steady_timer timer(co_await asio::this_coro::executor);
  std::vector<balancer::engine_load> snapshot(backends_.size());
  std::vector<char> warned(backends_.size(), 0);  // a rank that gave no numbers is logged once
  for (;;) {
    const auto started = std::chrono::steady_clock::now();
    // One rank after the other, then one publication: the policy sees every rank's numbers change at
    // once, as a client of vLLM's coordinator does. A rank that does not answer keeps its last numbers.
    for (std::size_t r = 0; r < backends_.size(); ++r) {
      const auto page = co_await fetch(backends_[r], "/metrics", "dplb-engine-stats", timeout_, 16u << 20);
      const auto load = page && page->status == 200 ? parse_engine_load(page->body) : std::nullopt;
      if (load) {
        snapshot[r] = *load;
        if (std::exchange(warned[r], char{0})) spdlog::info("engine stats: rank {} ({}) answers again", r, backends_[r].url);
      } else if (!std::exchange(warned[r], char{1})) {
        spdlog::warn("engine stats: no vllm:num_requests_waiting/running from rank {} ({}); keeping its last "
                     "numbers until it answers again", r, backends_[r].url);
      }
      if (stopped_.load(std::memory_order_relaxed)) co_return;
    }
    balancer_.publish_engine_stats(snapshot);
    timer.expires_at(started + interval_);
    auto [ec] = co_await timer.async_wait(asio::as_tuple(asio::use_awaitable));
    if (ec || stopped_.load(std::memory_order_relaxed)) co_return;
  }
}

}  // namespace dplb::upstream
