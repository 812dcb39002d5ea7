#include "dplb/upstream/model_context.hpp"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <nlohmann/json.hpp>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>

#include "dplb/support/json_text.hpp"
#include "dplb/support/supervisor.hpp"
#include "dplb/upstream/http_fetch.hpp"

namespace dplb::upstream {

namespace asio = boost::asio;

namespace {

// A models list is a few hundred bytes per model; this bounds what an engine can make dplb hold and parse.
constexpr std::size_t models_body_limit = 1u << 20;
// nlohmann's parse recurses once per level: an answer nested deeper is no models list.
constexpr std::size_t models_depth_limit = 16;

}  // namespace

std::vector<std::pair<std::string, std::uint64_t>> model_context_lengths(std::string_view models_answer) {
  std::vector<std::pair<std::string, std::uint64_t>> out;
  if (support::json_nesting_depth(models_answer, models_depth_limit) > models_depth_limit) return out;
  const auto doc = nlohmann::json::parse(models_answer, nullptr, false);
  if (!doc.is_object()) return out;
  const auto data = doc.find("data");
  if (data == doc.end() || !data->is_array()) return out;
  for (const auto& card : *data) {
    if (!card.is_object()) continue;
    const auto id = card.find("id");
    const auto length = card.find("max_model_len");
    if (id == card.end() || !id->is_string() || length == card.end() || !length->is_number_unsigned()) continue;
    if (const auto n = length->get<std::uint64_t>(); n > 0) out.emplace_back(id->get<std::string>(), n);
  }
  return out;
}

model_context::model_context(const topology& topology, std::chrono::milliseconds timeout,
                             std::chrono::milliseconds refresh)
    : topology_(topology), timeout_(timeout), refresh_(refresh) {}

void model_context::start(const asio::any_io_executor& executor, support::supervisor& supervisor) {
  executor_ = executor;
  wake_.emplace(executor);
  support::supervise(supervisor, support::task::model_context, executor, [this] { return read_loop(); });
}

void model_context::stop() noexcept {
  stopped_.store(true, std::memory_order_relaxed);
  wake();
}

void model_context::wake() const {
  if (!executor_) return;
  // The timer is the loop's: cancelled on its own thread, never from the caller's.
  asio::post(*executor_, [this] {
    if (wake_) wake_->cancel();
  });
}

void model_context::want() const {
  if (!wanted_.load(std::memory_order_relaxed) && !wanted_.exchange(true, std::memory_order_relaxed)) wake();
}

std::optional<std::uint64_t> model_context::max_model_len(std::size_t cluster, std::string_view model) const {
  want();
  const auto t = table_.load();
  return t ? t->lookup(cluster, model) : std::nullopt;
}

std::optional<std::uint64_t> model_context::table::lookup(std::size_t cluster, std::string_view model) const {
  if (cluster >= by_cluster.size()) return std::nullopt;
  const auto& models = by_cluster[cluster];
  if (!model.empty()) {
    const auto found = models.find(model);
    if (found == models.end()) return std::nullopt;
    return found->second;
  }
  std::optional<std::uint64_t> longest;
  for (const auto& [name, length] : models) longest = std::max(longest.value_or(0), length);
  return longest;
}

asio::awaitable<void> model_context::read_all() {
  table next;
  for (const auto& target : topology_.backends()) {
    const auto answer = co_await fetch(target, "/v1/models", "dplb-model-context", timeout_, models_body_limit);
    if (!answer || answer->status != 200) continue;
    if (next.by_cluster.size() <= target.cluster) next.by_cluster.resize(target.cluster + 1);
    auto& models = next.by_cluster[target.cluster];
    for (auto& [name, length] : model_context_lengths(answer->body)) {
      auto& kept = models[name];
      kept = std::max(kept, length);  // engines that differ: the longest bounds what any may generate
    }
  }
  const auto previous = table_.load();
  if (!previous || previous->by_cluster != next.by_cluster) {
    std::string listed;
    for (std::size_t c = 0; c < next.by_cluster.size(); ++c) {
      for (const auto& [name, length] : next.by_cluster[c]) {
        listed += fmt::format("{}{} (cluster {}) {}", listed.empty() ? "" : ", ", name, c, length);
      }
    }
    spdlog::info("models' context lengths (max_model_len, from GET /v1/models): {}", listed.empty() ? "none listed" : listed);
  }
  table_.store(std::make_shared<const table>(std::move(next)));
}

asio::awaitable<void> model_context::read_loop() {
  for (;;) {
    while (!wanted_.load(std::memory_order_relaxed)) {
      if (stopped_.load(std::memory_order_relaxed)) co_return;
      wake_->expires_at(asio::steady_timer::time_point::max());
      co_await wake_->async_wait(asio::as_tuple(asio::use_awaitable));
    }
    if (stopped_.load(std::memory_order_relaxed)) co_return;
    support::fault_point(support::task::model_context);
    co_await read_all();
    wake_->expires_after(refresh_);
    co_await wake_->async_wait(asio::as_tuple(asio::use_awaitable));
  }
}

}  // namespace dplb::upstream
