#include "dplb/pd/leg_bodies.hpp"

#include <array>
#include <nlohmann/json.hpp>

#include "dplb/support/json_text.hpp"

namespace dplb::pd {

namespace {

// Key order kept: the engine sees the client's fields where the client put them.
using json = nlohmann::ordered_json;

// What a 1-token, non-streaming prefill must not carry (vLLM's toy proxy drops the same).
constexpr std::array<std::string_view, 3> dropped_on_prefill{"stream_options", "min_tokens", "min_completion_tokens"};

std::optional<json> object_of(std::string_view body) {
  // The object's own braces first and last (whitespace aside): nlohmann also takes a byte order mark before
  // it, which decode_body(), writing into the client's bytes, could not place the params after.
  const auto open = body.find_first_not_of(" \t\r\n");
  if (open == std::string_view::npos || body[open] != '{') return std::nullopt;
  if (support::json_nesting_depth(body, max_body_nesting) > max_body_nesting) return std::nullopt;
  json parsed = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (!parsed.is_object()) return std::nullopt;
  return parsed;
}

}  // namespace

std::optional<std::string> prefill_body(std::string_view client_body) {
  auto body = object_of(client_body);
  if (!body) return std::nullopt;
  for (const auto key : dropped_on_prefill) body->erase(std::string(key));
  (*body)["kv_transfer_params"] = json{{"do_remote_decode", true},   {"do_remote_prefill", false},
                                       {"remote_engine_id", nullptr}, {"remote_block_ids", nullptr},
                                       {"remote_host", nullptr},      {"remote_port", nullptr}};
  (*body)["stream"] = false;
  (*body)["max_tokens"] = 1;
  if (body->contains("max_completion_tokens")) (*body)["max_completion_tokens"] = 1;
  return body->dump();
}

std::optional<std::string_view> kv_transfer_params_of(std::string_view prefill_answer) {
  const auto params = support::json_member_text(prefill_answer, "kv_transfer_params");
  if (!params || params->empty() || params->front() != '{') return std::nullopt;
  return params;
}

std::optional<std::string> decode_body(std::string_view client_body, std::string_view params) {
  std::string base;
  if (support::json_member_text(client_body, "kv_transfer_params")) {
    // The client sent its own: dropped (through a tree, since it may sit anywhere among the keys).
    auto body = object_of(client_body);
    if (!body) return std::nullopt;
    body->erase("kv_transfer_params");
    base = body->dump();
  } else {
    base = std::string(client_body);
  }
  // Inserted before the object's closing brace; everything before it stays byte for byte the client's.
  const auto close = base.find_last_not_of(" \t\r\n");
  const auto open = base.find_first_not_of(" \t\r\n");
  if (close == std::string::npos || base[close] != '}' || base[open] != '{') return std::nullopt;
  const auto last_inside = base.find_last_not_of(" \t\r\n", close - 1);
  const bool empty = last_inside == open;
  std::string out = base.substr(0, close);
  out += empty ? "\"kv_transfer_params\":" : ",\"kv_transfer_params\":";
  out += params;
  out += base.substr(close);
  return out;
}

}  // namespace dplb::pd
