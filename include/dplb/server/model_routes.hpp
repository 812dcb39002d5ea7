#pragma once
// Which cluster serves a request, from its body's "model": the table built once from the
// configuration's clusters, and the /v1/models list dplb answers itself when there are clusters.
// Immutable after start-up; read by every worker without a lock.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "dplb/config/settings.hpp"

namespace dplb::server {

class model_routes {
 public:
  explicit model_routes(const config::settings& settings);

  // Whether the model decides the cluster: some cluster lists its models. Without clusters (one
  // implicit cluster that serves any model) dplb neither reads the model nor answers /v1/models.
  bool by_model() const noexcept { return !models_.empty(); }
  // The cluster serving `model`, or nullopt when none does (the client then gets vLLM's 404).
  std::optional<std::size_t> cluster_of(std::string_view model) const noexcept;
  std::size_t default_cluster() const noexcept { return default_cluster_; }

  // GET /v1/models, as vLLM answers it (an OpenAI model list, owned_by "vllm"): every cluster's models, in
  // the configuration's order. `created` is the Unix time to show.
  std::string models_list(std::int64_t created) const;

 private:
  std::vector<std::pair<std::string, std::size_t>> models_;  // sorted by name: model -> cluster
  std::vector<std::string> in_order_;                        // as configured, for /v1/models
  std::size_t default_cluster_ = 0;
};

}  // namespace dplb::server
