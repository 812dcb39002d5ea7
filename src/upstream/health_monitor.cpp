#include "dplb/upstream/health_monitor.hpp"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <random>

#include "dplb/balancer/balancer.hpp"
#include "dplb/metrics/proxy_metrics.hpp"
#include "dplb/support/supervisor.hpp"
#include "dplb/upstream/http_fetch.hpp"

namespace dplb::upstream {

namespace asio = boost::asio;
constexpr auto as_result = asio::as_tuple(asio::use_awaitable);

health_monitor::health_monitor(const topology& topology, balancer::balancer& balancer,
                               metrics::proxy_metrics& metrics, health_check_settings settings)
    : topology_(topology), balancer_(balancer), metrics_(metrics), settings_(std::move(settings)),
      ranks_(topology.ranks().size(), rank_health(settings_.policy)),
      streaks_(std::make_unique<failure_streak[]>(topology.capacity())) {}

void health_monitor::add_ranks() {
  std::lock_guard lock(mutex_);
  const auto ranks = topology_.ranks().size();
  while (ranks_.size() < ranks) {
    ranks_.emplace_back(settings_.policy);
    apply(ranks_.size() - 1);
  }
}

void health_monitor::restart(std::size_t rank) {
  std::lock_guard lock(mutex_);
  if (rank >= ranks_.size()) return;
  ranks_[rank] = rank_health(settings_.policy);
  streaks_[rank].count.store(0, std::memory_order_relaxed);
  apply(rank);
}

bool health_monitor::removed(std::size_t rank) const {
  return (balancer_.flags(rank) & balancer::rank_flag::removed) != 0;
}

void health_monitor::apply(std::size_t rank) {
  const auto& h = ranks_[rank];
  balancer_.set_flag(rank, balancer::rank_flag::unhealthy, !h.healthy());
  balancer_.set_flag(rank, balancer::rank_flag::ejected, h.ejected());
  metrics_.rank_state(rank, h.healthy(), h.ejected());
}

// Every request reports here, and nearly all succeed on a rank without a failure streak, where
// rank_health::record changes nothing (a success only resets the streak). So a success skips the lock
// when its rank's streak count reads 0. The count is only written under mutex_, in the same critical
// section as the rank_health it mirrors, so the skip is exact: a failure recorded before the success
// (on any thread, if it happened-before) is seen by the load, by coherence; a 0 read while another
// thread is recording a failure means the two are concurrent, and the result is that of the success
// going first, an order the lock could equally have chosen.
void health_monitor::record(std::size_t rank, request_outcome outcome) {
  auto& streak = streaks_[rank].count;
  const bool success = outcome == request_outcome::success;
  if (success && streak.load(std::memory_order_relaxed) == 0) return;
  std::lock_guard lock(mutex_);
  bool may_eject = false;
  if (!success) {
    // Within the rank's cluster: another cluster's ranks cannot serve its requests. Removed ranks are no
    // part of the deployment any more.
    std::size_t ejected_now = 0;
    std::size_t in_service = 0;
    const auto ranks = topology_.ranks();
    const std::size_t cluster = rank < ranks.size() ? ranks[rank].cluster : 0;
    for (std::size_t r = 0; r < ranks_.size(); ++r) {
      if (removed(r) || ranks[r].cluster != cluster) continue;
      ++in_service;
      ejected_now += ranks_[r].ejected() ? 1 : 0;
    }
    may_eject = (ejected_now + 1) * 100 <= settings_.policy.max_ejected_percent * in_service;
  }
  if (rank >= ranks_.size()) return;
  const bool ejects = ranks_[rank].record(outcome, std::chrono::steady_clock::now(), may_eject);
  streak.store(ranks_[rank].consecutive_errors(), std::memory_order_relaxed);
  if (ejects) {
    const auto& h = ranks_[rank];
    const auto for_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
        *h.ejected_until() - std::chrono::steady_clock::now());
    spdlog::warn("rank {} ({}) ejected for {} ms after {} consecutive failed requests (ejection #{})", rank,
                 topology_.ranks()[rank].name, for_ms.count(), settings_.policy.ejection_threshold, h.times_ejected());
    metrics_.ejected(rank);
    apply(rank);
  }
}

bool health_monitor::healthy(std::size_t rank) const {
  std::lock_guard lock(mutex_);
  return ranks_[rank].healthy();
}

bool health_monitor::ejected(std::size_t rank) const {
  std::lock_guard lock(mutex_);
  return ranks_[rank].ejected();
}

void health_monitor::start(const asio::any_io_executor& executor, support::supervisor& supervisor) {
  supervisor_ = &supervisor;
  for (std::size_t r = 0; r < ranks_.size(); ++r) {
    std::lock_guard lock(mutex_);
    apply(r);
  }
  // A restart is safe: the loops keep nothing across iterations but their timers, and every lock is a guard.
  if (settings_.interval.count() > 0) {
    support::supervise(supervisor, support::task::health, executor, [this] { return probe_loop(); });
  }
  support::supervise(supervisor, support::task::health, executor, [this] { return tick_loop(); });
}

void health_monitor::stop() { stopped_.store(true); }

asio::awaitable<void> health_monitor::tick_loop() {
  // Ejections end on time (to 50 ms) even when active checks are off or slow.
  asio::steady_timer timer(co_await asio::this_coro::executor);
  for (;;) {
    timer.expires_after(std::chrono::milliseconds(50));
    auto [ec] = co_await timer.async_wait(as_result);
    std::lock_guard lock(mutex_);
    if (ec || stopped_) co_return;
    const auto now = std::chrono::steady_clock::now();
    for (std::size_t r = 0; r < ranks_.size(); ++r) {
      if (!ranks_[r].ejected()) continue;
      ranks_[r].tick(now);
      if (!ranks_[r].ejected()) {
        spdlog::info("rank {} ({}) back from ejection", r, topology_.ranks()[r].name);
        apply(r);
      }
    }
  }
}

asio::awaitable<void> health_monitor::probe_loop() {
  // Backends come at run time too (admin API, SIGHUP): each gets its timer within 50 ms of being added.
  // The topology is append-only and a removed backend keeps its entry, so its loop goes on, probing only
  // while the backend is in service: added again, it is checked at once.
  auto executor = co_await asio::this_coro::executor;
  asio::steady_timer timer(executor);
  for (;;) {
    const auto backends = topology_.backends();
    for (; probe_loops_ < backends.size(); ++probe_loops_) {
      // Each backend's loop is supervised on its own: a failure restarts that backend's timer alone.
      support::supervise(*supervisor_, support::task::health, executor,
                         [this, &target = backends[probe_loops_]] { return backend_probe_loop(target); });
    }
    timer.expires_after(std::chrono::milliseconds(50));
    auto [ec] = co_await timer.async_wait(as_result);
    if (ec || stopped_.load()) co_return;
  }
}

asio::awaitable<void> health_monitor::backend_probe_loop(const backend& target) {
  asio::steady_timer timer(co_await asio::this_coro::executor);
  // Up to a tenth of the interval: enough to spread the probes of many backends (and of several dplb
  // replicas started together) apart, little enough to keep a probe at least once an interval.
  std::minstd_rand random(std::random_device{}());
  const auto max_jitter = settings_.interval / 10;
  std::uniform_int_distribution<std::chrono::milliseconds::rep> jitter(0, max_jitter.count());
  auto next = std::chrono::steady_clock::now() + std::chrono::milliseconds(jitter(random));
  for (;;) {
    timer.expires_at(next);
    auto [ec] = co_await timer.async_wait(as_result);
    if (ec || stopped_.load()) co_return;
    support::fault_point(support::task::health);
    const auto started = std::chrono::steady_clock::now();
    if (!removed(target.first_rank)) {
      const bool ok = co_await probe(target);
      std::lock_guard lock(mutex_);
      if (stopped_) co_return;
      record_probe(target, ok);
    }
    // A probe that took longer than this (up to the timeout) is followed by the next at once.
    next = started + settings_.interval - std::chrono::milliseconds(jitter(random));
  }
}

void health_monitor::record_probe(const backend& target, bool ok) {
  for (std::size_t r = target.first_rank; r < target.first_rank + target.dp && r < ranks_.size(); ++r) {
    auto& h = ranks_[r];
    const bool was_healthy = h.healthy();
    ok ? h.probe_succeeded() : h.probe_failed();
    if (h.healthy() != was_healthy) {
      if (h.healthy()) spdlog::info("rank {} ({}) is healthy again", r, topology_.ranks()[r].name);
      else spdlog::warn("rank {} ({}) is down: {} consecutive failed health checks", r, topology_.ranks()[r].name,
                        settings_.policy.unhealthy_threshold);
    }
    apply(r);
  }
}

asio::awaitable<bool> health_monitor::probe(const backend& target) {
  const auto answer = co_await fetch(target, settings_.path, "dplb-health-check", settings_.timeout, 64 * 1024);
  co_return answer && answer->status == 200;
}

}  // namespace dplb::upstream
