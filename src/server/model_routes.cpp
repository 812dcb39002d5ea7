#include "dplb/server/model_routes.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>

namespace dplb::server {

model_routes::model_routes(const config::settings& settings) : default_cluster_(settings.default_cluster) {
  for (std::size_t c = 0; c < settings.clusters.size(); ++c) {
    for (const auto& model : settings.clusters[c].models) {
      models_.emplace_back(model, c);
      in_order_.push_back(model);
    }
  }
  std::ranges::sort(models_);
}

std::optional<std::size_t> model_routes::cluster_of(std::string_view model) const noexcept {
  const auto it = std::ranges::lower_bound(models_, model, {}, [](const auto& entry) { return std::string_view(entry.first); });
  if (it == models_.end() || it->first != model) return std::nullopt;
  return it->second;
}

std::string model_routes::models_list(std::int64_t created) const {
  auto data = nlohmann::ordered_json::array();
  for (const auto& model : in_order_) {
    data.push_back({{"id", model},
                    {"object", "model"},
                    {"created", created},
                    {"owned_by", "vllm"},
                    {"root", model},
                    {"parent", nullptr},
                    {"permission", nlohmann::ordered_json::array()}});
  }
  return nlohmann::ordered_json{{"object", "list"}, {"data", std::move(data)}}.dump();
}

}  // namespace dplb::server
