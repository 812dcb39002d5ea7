#include "rank_state.hpp"

#include <nlohmann/json.hpp>

namespace dplb::mock {

std::string port_metrics_text(const rank_state& rank, std::string_view model_name) {
  if (auto raw = rank.raw_metrics.load()) return std::move(*raw);
  std::vector<engine_view> engines;
  engines.reserve(rank.engines.size());
  for (const auto& engine : rank.engines) engines.push_back({engine.metrics, engine.label, engine.overrides.load()});
  return render_metrics(rank.metrics, rank.port_label(), engines, model_name);
}

std::string render_stats(const std::deque<rank_state>& ranks, const std::vector<std::uint16_t>& ports) {
  using ordered_json = nlohmann::ordered_json;
  const auto load = [](const auto& counter) { return counter.load(std::memory_order_relaxed); };
  ordered_json listed = ordered_json::array();
  for (const auto& rank : ranks) {
    ordered_json engines = ordered_json::array();
    for (const auto& engine : rank.engines) {
      const auto& m = engine.metrics;
      engines.push_back({{"engine", engine.index},
                         {"requests_routed", load(m.requests_routed)},
                         {"requests_routed_by_header", load(m.requests_routed_by_header)},
                         {"requests_in_flight", load(m.requests_in_flight)}});
    }
    ordered_json recent = ordered_json::array();
    for (const auto& request : rank.recent.load()) {
      recent.push_back({{"engine", request.engine ? ordered_json(*request.engine) : ordered_json(nullptr)},
                        {"x_data_parallel_rank",
                         request.header_value ? ordered_json(*request.header_value) : ordered_json(nullptr)}});
    }
    listed.push_back({{"rank", rank.index},
                      {"port", ports.at(rank.index)},
                      {"engines", std::move(engines)},
                      {"recent", std::move(recent)}});
  }
  ordered_json stats;
  stats["ports"] = std::move(listed);
  // Header values are whatever the client sent; replace invalid UTF-8 rather than fail.
  return stats.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace dplb::mock
