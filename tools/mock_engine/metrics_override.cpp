#include "metrics_override.hpp"

#include <limits>
#include <nlohmann/json.hpp>

namespace dplb::mock {
namespace {

using json = nlohmann::json;

// A gauge count: an integer >= 0 (booleans and floats refused), or null.
std::optional<std::string> read_count(const json& value, std::string_view field,
                                      std::optional<std::optional<std::int64_t>>& out) {
  if (value.is_null()) {
    out.emplace();
    return std::nullopt;
  }
  const auto error = std::string(field) + " must be an integer >= 0 or null";
  if (!value.is_number_integer()) return error;
  if (value.is_number_unsigned()) {
    if (value.get<std::uint64_t>() > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
      return error;
  } else if (value.get<std::int64_t>() < 0) {
    return error;
  }
  out = value.get<std::int64_t>();
  return std::nullopt;
}

std::optional<std::string> read_fraction(const json& value, std::optional<std::optional<double>>& out) {
  if (value.is_null()) {
    out.emplace();
    return std::nullopt;
  }
  if (!value.is_number() || value.get<double>() < 0) return std::string("kv_cache_usage must be a number >= 0 or null");
  out = value.get<double>();
  return std::nullopt;
}

template <class T>
json or_null(const std::optional<T>& value) {
  return value ? json(*value) : json(nullptr);
}

}  // namespace

std::variant<gauge_override_patch, std::string> parse_gauge_override_patch(std::string_view body) {
  gauge_override_patch patch;
  if (body.find_first_not_of(" \t\r\n") == std::string_view::npos) return patch;
  const json fields = json::parse(body, nullptr, false);
  if (fields.is_discarded()) return std::string("the body is not valid JSON");
  if (!fields.is_object()) return std::string("the body must be a JSON object");
  for (const auto& [key, value] : fields.items()) {
    std::optional<std::string> error;
    if (key == "running") {
      error = read_count(value, key, patch.running);
    } else if (key == "waiting") {
      error = read_count(value, key, patch.waiting);
    } else if (key == "kv_cache_usage") {
      error = read_fraction(value, patch.kv_cache_usage);
    } else {
      return "unknown field " + json(key).dump() + " (known: running, waiting, kv_cache_usage)";
    }
    if (error) return *error;
  }
  return patch;
}

gauge_overrides patched(gauge_overrides overrides, const gauge_override_patch& patch) {
  if (patch.running) overrides.running = *patch.running;
  if (patch.waiting) overrides.waiting = *patch.waiting;
  if (patch.kv_cache_usage) overrides.kv_cache_usage = *patch.kv_cache_usage;
  return overrides;
}

std::string render_gauge_overrides(const gauge_overrides& overrides) {
  nlohmann::ordered_json state;
  state["running"] = or_null(overrides.running);
  state["waiting"] = or_null(overrides.waiting);
  state["kv_cache_usage"] = or_null(overrides.kv_cache_usage);
  return state.dump();
}

}  // namespace dplb::mock
