#include "admin_api.hpp"

#include <charconv>
#include <optional>

#include "openai_api.hpp"

namespace dplb::mock {
namespace {

admin_answer admin_bad_request(std::string_view message, std::string_view param = {}) {
  return {400, "application/json", error_body(message, "BadRequestError", 400, param)};
}

// The value of `name` in a query string ("rank=2&x=y"): its first occurrence; none when absent.
std::optional<std::string_view> parameter(std::string_view query, std::string_view name) {
  while (!query.empty()) {
    const auto amp = query.find('&');
    const auto pair = query.substr(0, amp);
    query = amp == std::string_view::npos ? std::string_view{} : query.substr(amp + 1);
    if (pair.size() > name.size() && pair.starts_with(name) && pair[name.size()] == '=') {
      return pair.substr(name.size() + 1);
    }
  }
  return std::nullopt;
}

// The value of `name` in a query string, checked against `count`.
std::variant<unsigned, admin_answer> index_of(std::string_view query, std::string_view name, unsigned count) {
  const std::string expected =
      std::string(name) + " must be an integer in [0, " + std::to_string(count - 1) + "]";
  const auto text = parameter(query, name);
  if (!text) return admin_bad_request("missing ?" + std::string(name) + "=<i>: " + expected, name);
  unsigned index = 0;
  const auto [end, ec] = std::from_chars(text->data(), text->data() + text->size(), index);
  if (ec != std::errc() || end != text->data() + text->size() || index >= count) {
    return admin_bad_request(expected + ", got \"" + std::string(*text) + "\"", name);
  }
  return index;
}

// Whether the query string names `name` at all.
bool has_parameter(std::string_view query, std::string_view name) { return parameter(query, name).has_value(); }

// seq=<S>, a signed 64-bit integer, if present.
std::variant<std::optional<std::int64_t>, admin_answer> seq_of(std::string_view query) {
  const auto text = parameter(query, "seq");
  if (!text) return std::optional<std::int64_t>{};
  std::int64_t seq = 0;
  const auto [end, ec] = std::from_chars(text->data(), text->data() + text->size(), seq);
  if (ec != std::errc() || end != text->data() + text->size()) {
    return admin_bad_request("seq must be a signed 64-bit integer, got \"" + std::string(*text) + "\"", "seq");
  }
  return std::optional<std::int64_t>(seq);
}

admin_answer method_not_allowed(std::string_view allowed) {
  return {
      405, "application/json",
      error_body("Method Not Allowed (allowed: " + std::string(allowed) + ")", "MethodNotAllowedError", 405)};
}

// A route: the action of each method it allows (methods it does not list get 405).
struct route {
  std::string_view path;
  std::string_view allowed;  // for the 405's message
  std::optional<admin_action> get, post, del;
};

// Which query indices an action needs.
bool names_rank(admin_action action) {
  return action != admin_action::clear_overrides && action != admin_action::get_stats;
}
bool names_engine(admin_action action) {
  return action == admin_action::get_override || action == admin_action::set_override ||
         action == admin_action::publish_kv_event;
}

}  // namespace

std::variant<admin_command, admin_answer> parse_admin_request(std::string_view method,
                                                              std::string_view target, std::string_view body,
                                                              unsigned ranks, unsigned engines) {
  const auto query_at = target.find('?');
  const auto path = target.substr(0, query_at);
  const auto query = query_at == std::string_view::npos ? std::string_view{} : target.substr(query_at + 1);

  using enum admin_action;
  static const route routes[] = {
      {"/fault", "GET, POST, DELETE", get_fault, set_fault, clear_fault},
      {"/fault/clear", "POST", std::nullopt, clear_fault, std::nullopt},
      {"/metrics", "GET", get_metrics, std::nullopt, std::nullopt},
      {"/metrics/override", "GET, POST, DELETE", get_override, set_override, clear_overrides},
      {"/metrics/raw", "POST, DELETE", std::nullopt, set_raw_metrics, clear_raw_metrics},
      {"/stats", "GET", get_stats, std::nullopt, std::nullopt},
      {"/kv-events/publish", "POST", std::nullopt, publish_kv_event, std::nullopt},
      {"/kv-events/reset", "POST", std::nullopt, reset_kv_cache, std::nullopt},
  };
  const route* found = nullptr;
  for (const auto& r : routes) {
    if (r.path == path) found = &r;
  }
  if (found == nullptr) {
    return admin_answer{404, "application/json",
                        error_body("Not Found: " + std::string(path), "NotFoundError", 404)};
  }
  const auto action = method == "GET" ? found->get : method == "POST" ? found->post
                                                   : method == "DELETE" ? found->del
                                                                        : std::nullopt;
  if (!action) return method_not_allowed(found->allowed);

  admin_command command;
  command.action = *action;
  if (names_rank(command.action)) {
    auto rank = index_of(query, "rank", ranks);
    if (auto* error = std::get_if<admin_answer>(&rank)) return std::move(*error);
    command.rank = std::get<unsigned>(rank);
  }
  if (names_engine(command.action)) {
    auto engine = index_of(query, "engine", engines);
    if (auto* error = std::get_if<admin_answer>(&engine)) return std::move(*error);
    command.engine = std::get<unsigned>(engine);
  }
  if (command.action == reset_kv_cache) {  // engine= optional: all the rank's engines without it
    command.all_engines = !has_parameter(query, "engine");
    if (!command.all_engines) {
      auto engine = index_of(query, "engine", engines);
      if (auto* error = std::get_if<admin_answer>(&engine)) return std::move(*error);
      command.engine = std::get<unsigned>(engine);
    }
  }

  if (command.action == set_fault) {
    auto patch = parse_fault_patch(body);
    if (auto* error = std::get_if<std::string>(&patch)) return admin_bad_request(*error);
    command.patch = std::get<fault_patch>(patch);
  } else if (command.action == set_override) {
    auto patch = parse_gauge_override_patch(body);
    if (auto* error = std::get_if<std::string>(&patch)) return admin_bad_request(*error);
    command.override_patch = std::get<gauge_override_patch>(patch);
  } else if (command.action == set_raw_metrics) {
    command.raw_metrics = std::string(body);
  } else if (command.action == publish_kv_event) {
    auto seq = seq_of(query);
    if (auto* error = std::get_if<admin_answer>(&seq)) return std::move(*error);
    command.seq = std::get<std::optional<std::int64_t>>(seq);
    command.payload = std::string(body);
  }
  return command;
}

admin_answer admin_failure(unsigned status, std::string_view message) {
  return {status, "application/json",
          error_body(message, status < 500 ? "BadRequestError" : "InternalServerError", status)};
}

}  // namespace dplb::mock
