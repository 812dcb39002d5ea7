#pragma once
// One tenant as configured: its name, its share, the API keys its clients present and its limits. Plain data,
// as a configuration reads it; tenant_directory checks it and keeps its keys as digests only.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace dplb::tenants {

struct tenant_spec {
  // 1 to 64 of A-Z a-z 0-9 . _ -: it becomes a metric label. "default" configures the tenant of requests
  // that name no other.
  std::string name = {};
  // Its share against the other tenants' when they compete for the ranks; at least 1.
  std::uint32_t weight = 1;
  // Keys its clients send as `Authorization: Bearer KEY`, as the keys themselves or as their SHA-256 in
  // lowercase hex (64 digits, as sha256sum prints them), so that a configuration file need not hold a key.
  std::vector<std::string> api_keys = {};
  std::vector<std::string> api_key_sha256 = {};
  // Limits; unset, none.
  std::optional<double> requests_per_second = std::nullopt;
  std::optional<std::uint64_t> burst = std::nullopt;  // the request rate's; unset, token_bucket's default
  std::optional<std::size_t> max_queued = std::nullopt;  // its requests waiting for a rank at once
  // Prompt tokens plus max_tokens its requests may reserve in a minute (corrected by the usage reported).
  std::optional<double> tokens_per_minute = std::nullopt;
  // The longest one of its requests may wait in the queue; overrides settings' max_queue_wait.
  std::optional<std::chrono::milliseconds> max_queue_wait = std::nullopt;
  // The lowest body `priority` its requests may have (vLLM's: lower is served sooner; absent, 0): one below
  // is raised to it, in dplb's queue and in the body the engine gets. Unset: any priority.
  std::optional<std::int64_t> min_priority = std::nullopt;
};

}  // namespace dplb::tenants
