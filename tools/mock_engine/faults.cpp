#include "faults.hpp"

#include <limits>
#include <nlohmann/json.hpp>

#include "openai_api.hpp"

namespace dplb::mock {
namespace {

using json = nlohmann::json;
using ordered_json = nlohmann::ordered_json;

// A day, as for --ttft-ms: longer is a typo, and it keeps time-point arithmetic far from overflow.
constexpr std::int64_t max_stall_ms = 86'400'000;

std::string range_error(std::string_view field, std::int64_t min, std::int64_t max) {
  return std::string(field) + " must be an integer in [" + std::to_string(min) + ", " + std::to_string(max) +
         "]";
}

// An integer field in [min, max]; booleans and floats are refused (nlohmann would convert them).
std::variant<std::int64_t, std::string> integer_field(const json& value, std::string_view field,
                                                      std::int64_t min, std::int64_t max) {
  if (!value.is_number_integer()) return range_error(field, min, max);
  if (value.is_number_unsigned()) {
    const auto n = value.get<std::uint64_t>();
    if (n > static_cast<std::uint64_t>(max)) return range_error(field, min, max);
    if (static_cast<std::int64_t>(n) < min) return range_error(field, min, max);
    return static_cast<std::int64_t>(n);
  }
  const auto n = value.get<std::int64_t>();
  if (n < min || n > max) return range_error(field, min, max);
  return n;
}

// The reason phrases of the statuses a test is likely to inject; others get a generic type.
std::string_view reason_phrase(unsigned status) {
  switch (status) {
    case 400:
      return "Bad Request";
    case 401:
      return "Unauthorized";
    case 403:
      return "Forbidden";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 408:
      return "Request Timeout";
    case 409:
      return "Conflict";
    case 413:
      return "Request Entity Too Large";
    case 422:
      return "Unprocessable Entity";
    case 429:
      return "Too Many Requests";
    case 500:
      return "Internal Server Error";
    case 501:
      return "Not Implemented";
    case 502:
      return "Bad Gateway";
    case 503:
      return "Service Unavailable";
    case 504:
      return "Gateway Timeout";
    default:
      return {};
  }
}

// vLLM's error types are the reason phrase without spaces, ending in "Error" (BadRequestError,
// NotFoundError, InternalServerError).
std::string error_type(unsigned status) {
  const auto phrase = reason_phrase(status);
  if (phrase.empty()) return status < 500 ? "BadRequestError" : "InternalServerError";
  std::string type;
  for (const char c : phrase) {
    if (c != ' ') type += c;
  }
  if (!type.ends_with("Error")) type += "Error";
  return type;
}

}  // namespace

std::variant<fault_patch, std::string> parse_fault_patch(std::string_view body) {
  fault_patch patch;
  if (body.find_first_not_of(" \t\r\n") == std::string_view::npos) return patch;
  const json fields = json::parse(body, nullptr, false);
  if (fields.is_discarded()) return std::string("the body is not valid JSON");
  if (!fields.is_object()) return std::string("the body must be a JSON object");

  for (const auto& [key, value] : fields.items()) {
    const auto as_bool = [&](std::optional<bool>& out) -> std::optional<std::string> {
      if (!value.is_boolean()) return key + " must be true or false";
      out = value.get<bool>();
      return std::nullopt;
    };
    std::optional<std::string> error;
    if (key == "health_status") {
      auto n = integer_field(value, key, 200, 599);
      if (auto* e = std::get_if<std::string>(&n)) return *e;
      patch.health_status = static_cast<unsigned>(std::get<std::int64_t>(n));
    } else if (key == "status") {
      const auto n = integer_field(value, key, 0, 599);
      const auto* status = std::get_if<std::int64_t>(&n);
      if (status == nullptr || (*status != 0 && *status < 400))
        return std::string("status must be 0 (off) or an integer in [400, 599]");
      patch.status = static_cast<unsigned>(*status);
    } else if (key == "reset_after_events") {
      auto n = integer_field(value, key, 0, std::numeric_limits<std::int64_t>::max());
      if (auto* e = std::get_if<std::string>(&n)) return *e;
      patch.reset_after_events = static_cast<std::uint64_t>(std::get<std::int64_t>(n));
    } else if (key == "stall_ms") {
      auto n = integer_field(value, key, 0, max_stall_ms);
      if (auto* e = std::get_if<std::string>(&n)) return *e;
      patch.stall = std::chrono::milliseconds(std::get<std::int64_t>(n));
    } else if (key == "reset_on_request") {
      error = as_bool(patch.reset_on_request);
    } else if (key == "listening") {
      error = as_bool(patch.listening);
    } else if (key == "accept_but_ignore") {
      error = as_bool(patch.accept_but_ignore);
    } else {
      return "unknown field " + json(key).dump() +
             " (known: health_status, status, reset_on_request, reset_after_events, stall_ms, listening, "
             "accept_but_ignore)";
    }
    if (error) return *error;
  }
  return patch;
}

fault_settings patched(fault_settings settings, const fault_patch& patch) {
  if (patch.health_status) settings.health_status = *patch.health_status;
  if (patch.status) settings.status = *patch.status;
  if (patch.reset_on_request) settings.reset_on_request = *patch.reset_on_request;
  if (patch.reset_after_events) settings.reset_after_events = *patch.reset_after_events;
  if (patch.stall) settings.stall = *patch.stall;
  if (patch.listening) settings.listening = *patch.listening;
  if (patch.accept_but_ignore) settings.accept_but_ignore = *patch.accept_but_ignore;
  return settings;
}

std::string render_fault_settings(const fault_settings& settings) {
  ordered_json state;
  state["health_status"] = settings.health_status;
  state["status"] = settings.status;
  state["reset_on_request"] = settings.reset_on_request;
  state["reset_after_events"] = settings.reset_after_events;
  state["stall_ms"] = settings.stall.count();
  state["listening"] = settings.listening;
  state["accept_but_ignore"] = settings.accept_but_ignore;
  return state.dump();
}

std::string injected_error_body(unsigned status) {
  return error_body("Fault injected by dplb-mock-engine: status " + std::to_string(status) + ".",
                    error_type(status), status);
}

fault_settings rank_faults::load() const {
  fault_settings settings;
  settings.health_status = health_status();
  settings.status = status();
  settings.reset_on_request = reset_on_request();
  settings.reset_after_events = reset_after_events();
  settings.stall = stall();
  settings.listening = listening_.load(std::memory_order_relaxed);
  settings.accept_but_ignore = accept_but_ignore();
  return settings;
}

void rank_faults::store(const fault_settings& settings) {
  health_status_.store(settings.health_status, std::memory_order_relaxed);
  status_.store(settings.status, std::memory_order_relaxed);
  reset_on_request_.store(settings.reset_on_request, std::memory_order_relaxed);
  reset_after_events_.store(settings.reset_after_events, std::memory_order_relaxed);
  stall_ms_.store(settings.stall.count(), std::memory_order_relaxed);
  listening_.store(settings.listening, std::memory_order_relaxed);
  accept_but_ignore_.store(settings.accept_but_ignore, std::memory_order_relaxed);
}

}  // namespace dplb::mock
