#include "dplb/upstream/engine_stats_poller.hpp"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <spdlog/spdlog.h>

#include "dplb/balancer/balancer.hpp"
#include "dplb/support/supervisor.hpp"
#include "dplb/upstream/http_fetch.hpp"

#include <algorithm>
#include <cmath>
#include <exception>
#include <limits>

namespace dplb::upstream {

namespace asio = boost::asio;

engine_stats_poller::engine_stats_poller(const topology& topology, balancer::balancer& balancer,
                                         std::chrono::milliseconds interval, std::chrono::milliseconds timeout)
    : topology_(topology), balancer_(balancer), interval_(interval), timeout_(timeout), warned_(topology.capacity()) {}

void engine_stats_poller::start(const asio::any_io_executor& executor, support::supervisor& supervisor) {
  support::supervise(supervisor, support::task::engine_stats, executor, [this] { return poll_loop(); });
}

// Which series belong to which rank: a plain backend's page is its one engine, whatever its engine label
// (an external-LB rank shows its global rank there); a `#dp=N` backend's page shows its N engines, labelled
// 0..N-1 (internal LB) or with their global ranks from some start (hybrid LB): N labels are taken in
// order, otherwise a label below N is the rank with that index.
bool engine_stats_poller::readings_from_page(const backend& target, std::string_view page,
                                             std::vector<balancer::engine_reading>& round) const {
  auto samples = parse_engine_samples(page);
  std::erase_if(samples, [](const engine_sample& s) { return !s.has_counts; });
  if (samples.empty()) return false;
  if (target.dp == 1) {
    engine_sample total;
    total.has_counts = true;
    for (const auto& s : samples) {
      total.running += s.running;
      total.waiting += s.waiting;
      if (s.kv_cache_usage) total.kv_cache_usage = std::max(total.kv_cache_usage.value_or(0.0), *s.kv_cache_usage);
    }
    round[target.first_rank].good = true;
    round[target.first_rank].load = load_of(total);
    return true;
  }
  const bool in_order = samples.size() == target.dp;
  bool any = false;
  for (std::size_t i = 0; i < samples.size(); ++i) {
    const std::size_t index = in_order ? i : samples[i].engine;
    if (index >= target.dp) continue;
    auto& reading = round[target.first_rank + index];
    reading.good = true;
    reading.load = load_of(samples[i]);
    any = true;
  }
  return any;
}

asio::awaitable<void> engine_stats_poller::read_backend(const backend& target,
                                                        std::vector<balancer::engine_reading>& round) {
  // In a reader, not in the loop: the test then shows a reader's exception failing its round, not hanging it.
  support::fault_point(support::task::engine_stats);
  // The engine counts its requests at some moment between this read leaving and its answer arriving. The
  // most of dplb's own it can have counted then is what dplb had in flight when the read left plus every
  // pick since: anything it reports beyond that is load dplb did not send (engine_view::inflight_at_read).
  // In flight at the answer alone would miss the requests that finished meanwhile, and in flight when the
  // read left would miss the ones a burst sent meanwhile: either way dplb's own requests would be counted
  // twice, and a burst would no longer be spread exactly.
  // The picks are read first, so a pick between the two reads counts in both: the bound errs high (dplb's
  // own request taken for its own), not low (dplb's own request taken for someone else's).
  std::vector<std::uint64_t> picks_before(target.dp);
  for (std::size_t i = 0; i < target.dp; ++i) picks_before[i] = balancer_.picks(target.first_rank + i);
  const auto sent_at = std::chrono::steady_clock::now();
  for (std::size_t r = target.first_rank; r < target.first_rank + target.dp; ++r) {
    round[r] = balancer::engine_reading{};
    round[r].inflight_at_read = balancer_.inflight(r);
    round[r].read_at = sent_at;
  }
  const auto page = co_await fetch(target, "/metrics", "dplb-engine-stats", timeout_, 16u << 20);
  for (std::size_t i = 0; i < target.dp; ++i) {
    const auto picked_meanwhile = balancer_.picks(target.first_rank + i) - picks_before[i];
    auto& reading = round[target.first_rank + i];
    reading.inflight_at_read = static_cast<std::uint32_t>(
        std::min<std::uint64_t>(reading.inflight_at_read + picked_meanwhile, std::numeric_limits<std::uint32_t>::max()));
  }
  const bool good = page && page->status == 200 && readings_from_page(target, page->body, round);
  if (good) {
    if (std::exchange(warned_[target.index], char{0})) spdlog::info("engine stats: {} answers again", target.url);
  } else if (!std::exchange(warned_[target.index], char{1})) {
    spdlog::warn("engine stats: no vllm:num_requests_waiting/running from {}; its ranks are balanced on dplb's "
                 "own counts until it answers again", target.url);
  }
}

asio::awaitable<void> engine_stats_poller::poll_loop() {
  auto executor = co_await asio::this_coro::executor;
  asio::steady_timer timer(executor);
  asio::steady_timer all_done(executor);
  std::vector<balancer::engine_reading> round;
  for (;;) {
    const auto started = std::chrono::steady_clock::now();
    // The topology as it is now: backends added later are read from the next round on. A removed one is
    // not read; its ranks' last numbers go stale, unused.
    const auto backends = topology_.backends();
    round.assign(topology_.ranks().size(), balancer::engine_reading{});
    // Every backend at once, then one publication: the policy sees every rank's numbers change together,
    // as a client of vLLM's coordinator does, and one slow engine (bounded by the timeout) delays the
    // others' numbers by no more than it takes. The readers run on this thread and this frame outlives
    // them: it waits for the last one.
    std::size_t pending = 1;  // this loop's own count, dropped once every reader is spawned
    std::exception_ptr reader_error;
    all_done.expires_at(std::chrono::steady_clock::time_point::max());
    // A reader is counted done by its completion, whichever way it ended: one that threw must not leave
    // this loop waiting for it forever.
    const auto reader_done = [&](std::exception_ptr error) {
      if (error && !reader_error) reader_error = error;
      if (--pending == 0) all_done.cancel();
    };
    for (const auto& target : backends) {
      if ((balancer_.flags(target.first_rank) & balancer::rank_flag::removed) != 0) continue;
      ++pending;
      asio::co_spawn(executor, read_backend(target, round), reader_done);
    }
    --pending;
    while (pending > 0) co_await all_done.async_wait(asio::as_tuple(asio::use_awaitable));
    // Thrown here, once no reader refers to this frame any more, for the supervisor to log and restart.
    if (reader_error) std::rethrow_exception(reader_error);
    if (stopped_.load(std::memory_order_relaxed)) co_return;
    balancer_.publish_engine_stats(round);
    timer.expires_at(started + interval_);
    auto [ec] = co_await timer.async_wait(asio::as_tuple(asio::use_awaitable));
    if (ec || stopped_.load(std::memory_order_relaxed)) co_return;
  }
}

}  // namespace dplb::upstream
