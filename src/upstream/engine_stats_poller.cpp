#include "dplb/upstream/engine_stats_poller.hpp"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <spdlog/spdlog.h>

#include <charconv>
#include <cmath>

#include "dplb/balancer/balancer.hpp"
#include "dplb/upstream/http_fetch.hpp"

namespace dplb::upstream {

namespace asio = boost::asio;

namespace {

// The sample value of a line that starts with `name` followed by a label set or a space; nullopt for
// any other line (another metric, a comment, a longer name sharing the prefix).
std::optional<double> sample_of(std::string_view line, std::string_view name) {
  if (!line.starts_with(name)) return std::nullopt;
  line.remove_prefix(name.size());
  if (line.starts_with('{')) {
    // Label values may hold any character but an unescaped quote, so the label set ends at the first
    // '}' outside quotes.
    bool quoted = false;
    std::size_t i = 1;
    for (; i < line.size(); ++i) {
      if (line[i] == '\\' && quoted) ++i;
      else if (line[i] == '"') quoted = !quoted;
      else if (line[i] == '}' && !quoted) break;
    }
    if (i >= line.size()) return std::nullopt;
    line.remove_prefix(i + 1);
  }
  if (!line.starts_with(' ')) return std::nullopt;
  while (line.starts_with(' ')) line.remove_prefix(1);
  double value = 0;
  const auto [end, ec] = std::from_chars(line.data(), line.data() + line.size(), value);
  if (ec != std::errc{} || !std::isfinite(value) || value < 0) return std::nullopt;
  return value;
}

std::uint32_t to_count(double sum) {
  return sum >= 4e9 ? 4'000'000'000u : static_cast<std::uint32_t>(std::llround(sum));
}

}  // namespace

std::optional<balancer::engine_load> parse_engine_load(std::string_view text) {
  double waiting = 0, running = 0;
  bool seen = false;
  while (!text.empty()) {
    const auto eol = text.find('\n');
    const auto line = text.substr(0, eol);
    text.remove_prefix(eol == std::string_view::npos ? text.size() : eol + 1);
    if (const auto v = sample_of(line, "vllm:num_requests_waiting")) waiting += *v, seen = true;
    else if (const auto v = sample_of(line, "vllm:num_requests_running")) running += *v, seen = true;
  }
  if (!seen) return std::nullopt;
  return balancer::engine_load{to_count(waiting), to_count(running)};
}

engine_stats_poller::engine_stats_poller(const topology& topology, balancer::balancer& balancer,
                                         std::chrono::milliseconds interval, std::chrono::milliseconds timeout)
    : topology_(topology), balancer_(balancer), interval_(interval), timeout_(timeout), warned_(topology.backends.size()) {}

void engine_stats_poller::start(const asio::any_io_executor& executor) {
  asio::co_spawn(executor, poll_loop(), asio::detached);
}

bool engine_stats_poller::readings_from_page(const backend& target, std::string_view page,
                                             std::vector<balancer::engine_reading>& round) const {
  if (target.dp != 1) return false;  // per-engine series: read with the per-engine parser
  const auto load = parse_engine_load(page);
  if (!load) return false;
  round[target.first_rank].good = true;
  round[target.first_rank].load = *load;
  return true;
}

asio::awaitable<void> engine_stats_poller::read_backend(const backend& target,
                                                        std::vector<balancer::engine_reading>& round,
                                                        std::size_t& pending, asio::steady_timer& all_done) {
  // Taken before the request leaves: whatever dplb sends the ranks from now on may be missing from the
  // page, and the policies add it back (engine_view::picks_since_read).
  const auto sent_at = std::chrono::steady_clock::now();
  for (std::size_t r = target.first_rank; r < target.first_rank + target.dp; ++r) {
    round[r] = balancer::engine_reading{};
    round[r].picks_before_read = balancer_.picks(r);
    round[r].read_at = sent_at;
  }
  const auto page = co_await fetch(target, "/metrics", "dplb-engine-stats", timeout_, 16u << 20);
  const bool good = page && page->status == 200 && readings_from_page(target, page->body, round);
  if (good) {
    if (std::exchange(warned_[target.index], char{0})) spdlog::info("engine stats: {} answers again", target.url);
  } else if (!std::exchange(warned_[target.index], char{1})) {
    spdlog::warn("engine stats: no vllm:num_requests_waiting/running from {}; its ranks are balanced on dplb's "
                 "own counts until it answers again", target.url);
  }
  if (--pending == 0) all_done.cancel();
}

asio::awaitable<void> engine_stats_poller::poll_loop() {
  auto executor = co_await asio::this_coro::executor;
  asio::steady_timer timer(executor);
  asio::steady_timer all_done(executor);
  std::vector<balancer::engine_reading> round(topology_.hosts.size());
  for (;;) {
    const auto started = std::chrono::steady_clock::now();
    // Every backend at once, then one publication: the policy sees every rank's numbers change together,
    // as a client of vLLM's coordinator does, and one slow engine (bounded by the timeout) delays the
    // others' numbers by no more than it takes. The readers run on this thread and this frame outlives
    // them: it waits for the last one.
    std::size_t pending = topology_.backends.size();
    all_done.expires_at(std::chrono::steady_clock::time_point::max());
    for (const auto& target : topology_.backends) {
      asio::co_spawn(executor, read_backend(target, round, pending, all_done), asio::detached);
    }
    while (pending > 0) co_await all_done.async_wait(asio::as_tuple(asio::use_awaitable));
    if (stopped_.load(std::memory_order_relaxed)) co_return;
    balancer_.publish_engine_stats(round);
    timer.expires_at(started + interval_);
    auto [ec] = co_await timer.async_wait(asio::as_tuple(asio::use_awaitable));
    if (ec || stopped_.load(std::memory_order_relaxed)) co_return;
  }
}

}  // namespace dplb::upstream
