#include "admin_api.hpp"

#include <charconv>

#include "openai_api.hpp"

namespace dplb::mock {
namespace {

admin_answer bad_request(std::string_view message, std::string_view param = {}) {
  return {400, "application/json", error_body(message, "BadRequestError", 400, param)};
}

// The value of `rank` in a query string ("rank=2&x=y"), checked against the rank count.
std::variant<unsigned, admin_answer> rank_of(std::string_view query, unsigned ranks) {
  const std::string expected = "rank must be an integer in [0, " + std::to_string(ranks - 1) + "]";
  while (!query.empty()) {
    const auto amp = query.find('&');
    const auto pair = query.substr(0, amp);
    query = amp == std::string_view::npos ? std::string_view{} : query.substr(amp + 1);
    if (!pair.starts_with("rank=")) continue;
    const auto text = pair.substr(5);
    unsigned rank = 0;
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), rank);
    if (ec != std::errc() || end != text.data() + text.size() || rank >= ranks) {
      return bad_request(expected + ", got \"" + std::string(text) + "\"", "rank");
    }
    return rank;
  }
  return bad_request("missing ?rank=<i>: " + expected, "rank");
}

admin_answer method_not_allowed(std::string_view allowed) {
  return {
      405, "application/json",
      error_body("Method Not Allowed (allowed: " + std::string(allowed) + ")", "MethodNotAllowedError", 405)};
}

}  // namespace

std::variant<admin_command, admin_answer> parse_admin_request(std::string_view method,
                                                              std::string_view target, std::string_view body,
                                                              unsigned ranks) {
  const auto query_at = target.find('?');
  const auto path = target.substr(0, query_at);
  const auto query = query_at == std::string_view::npos ? std::string_view{} : target.substr(query_at + 1);

  admin_command command;
  if (path == "/fault") {
    if (method == "GET") {
      command.action = admin_action::get_fault;
    } else if (method == "POST") {
      command.action = admin_action::set_fault;
    } else if (method == "DELETE") {
      command.action = admin_action::clear_fault;
    } else {
      return method_not_allowed("GET, POST, DELETE");
    }
  } else if (path == "/fault/clear") {
    if (method != "POST") return method_not_allowed("POST");
    command.action = admin_action::clear_fault;
  } else if (path == "/metrics") {
    if (method != "GET") return method_not_allowed("GET");
    command.action = admin_action::get_metrics;
  } else {
    return admin_answer{404, "application/json",
                        error_body("Not Found: " + std::string(path), "NotFoundError", 404)};
  }

  auto rank = rank_of(query, ranks);
  if (auto* error = std::get_if<admin_answer>(&rank)) return std::move(*error);
  command.rank = std::get<unsigned>(rank);

  if (command.action == admin_action::set_fault) {
    auto patch = parse_fault_patch(body);
    if (auto* error = std::get_if<std::string>(&patch)) return bad_request(*error);
    command.patch = std::get<fault_patch>(patch);
  }
  return command;
}

admin_answer admin_failure(unsigned status, std::string_view message) {
  return {status, "application/json",
          error_body(message, status < 500 ? "BadRequestError" : "InternalServerError", status)};
}

}  // namespace dplb::mock
