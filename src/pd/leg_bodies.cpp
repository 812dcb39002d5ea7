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

// The member name dplb owns, and the reading of a body's top-level keys that looks for it.
constexpr std::string_view params_key = "kv_transfer_params";

bool blank(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

std::size_t skip_blanks(std::string_view t, std::size_t i) {
  while (i < t.size() && blank(t[i])) ++i;
  return i;
}

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// The string starting at t[i] == '"': where it ends (just past its closing quote, or npos), and whether it
// spells `name` once its escapes are decoded.
struct string_scan {
  std::size_t end = std::string_view::npos;
  bool spells_name = false;
};
string_scan scan_string(std::string_view t, std::size_t i, std::string_view name) {
  std::size_t matched = 0;  // characters of `name` matched so far
  bool same = true;
  const auto take = [&](unsigned code) {
    same = same && matched < name.size() && static_cast<unsigned char>(name[matched]) == code;
    ++matched;
  };
  for (++i; i < t.size(); ++i) {
    const char c = t[i];
    if (c == '"') return {i + 1, same && matched == name.size()};
    if (c != '\\') {
      take(static_cast<unsigned char>(c));
      continue;
    }
    if (++i >= t.size()) break;
    switch (t[i]) {
      case 'u': {
        unsigned code = 0;
        for (int d = 0; d < 4; ++d) {
          const int v = i + 1 < t.size() ? hex_digit(t[i + 1]) : -1;
          if (v < 0) return {};
          code = code * 16 + static_cast<unsigned>(v);
          ++i;
        }
        take(code);  // a code point beyond ASCII never matches the (ASCII) name
        break;
      }
      case 'b': take('\b'); break;
      case 'f': take('\f'); break;
      case 'n': take('\n'); break;
      case 'r': take('\r'); break;
      case 't': take('\t'); break;
      default: take(static_cast<unsigned char>(t[i])); break;  // \" \\ \/ (and what Python refuses anyway)
    }
  }
  return {};
}

// A body Python's json would decode from UTF-16 or UTF-32 (json.detect_encoding): a byte order mark of
// theirs, or a NUL among the first four bytes (JSON text in UTF-8 has none).
bool wide_encoding(std::string_view body) {
  if (body.starts_with("\xFE\xFF") || body.starts_with("\xFF\xFE")) return true;
  return body.substr(0, 4).find('\0') != std::string_view::npos;
}

}  // namespace

bool sets_kv_transfer_params(std::string_view body) {
  if (wide_encoding(body)) return true;
  if (body.starts_with("\xEF\xBB\xBF")) body.remove_prefix(3);
  std::size_t i = skip_blanks(body, 0);
  if (i >= body.size() || body[i] != '{') return false;
  i = skip_blanks(body, i + 1);
  while (i < body.size() && body[i] == '"') {
    const auto key = scan_string(body, i, params_key);
    if (key.spells_name) return true;
    if (key.end == std::string_view::npos) return false;
    i = skip_blanks(body, key.end);
    if (i >= body.size() || body[i] != ':') return false;
    const std::size_t value_end = support::json_value_end(body, skip_blanks(body, i + 1));
    if (value_end == std::string_view::npos) return false;
    i = skip_blanks(body, value_end);
    if (i >= body.size() || body[i] != ',') return false;
    i = skip_blanks(body, i + 1);
  }
  return false;
}

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
