#include "dplb/support/json_text.hpp"

#include <algorithm>

namespace dplb::support {

namespace {

bool blank(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

std::size_t skip_blanks(std::string_view t, std::size_t i) {
  while (i < t.size() && blank(t[i])) ++i;
  return i;
}

// The end of the string starting at t[i] == '"' (just past its closing quote), or npos.
std::size_t skip_string(std::string_view t, std::size_t i) {
  for (++i; i < t.size(); ++i) {
    if (t[i] == '\\') {
      ++i;
    } else if (t[i] == '"') {
      return i + 1;
    }
  }
  return std::string_view::npos;
}

// The end of the value starting at t[i] (a string, a container, or a literal), or npos.
std::size_t skip_value(std::string_view t, std::size_t i) {
  if (i >= t.size()) return std::string_view::npos;
  if (t[i] == '"') return skip_string(t, i);
  if (t[i] == '{' || t[i] == '[') {
    std::size_t depth = 0;
    while (i < t.size()) {
      const char c = t[i];
      if (c == '"') {
        i = skip_string(t, i);
        if (i == std::string_view::npos) return i;
        continue;
      }
      if (c == '{' || c == '[') ++depth;
      if ((c == '}' || c == ']') && --depth == 0) return i + 1;
      ++i;
    }
    return std::string_view::npos;
  }
  // A literal: up to the next delimiter.
  const std::size_t start = i;
  while (i < t.size() && !blank(t[i]) && t[i] != ',' && t[i] != '}' && t[i] != ']') ++i;
  return i == start ? std::string_view::npos : i;
}

}  // namespace

std::size_t json_value_end(std::string_view text, std::size_t at) { return skip_value(text, at); }

std::size_t json_nesting_depth(std::string_view text, std::size_t limit) {
  std::size_t depth = 0, deepest = 0;
  bool in_string = false, escaped = false;
  for (const char c : text) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      deepest = std::max(deepest, ++depth);
      if (deepest > limit) return deepest;
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return deepest;
}

std::optional<std::string_view> json_member_text(std::string_view t, std::string_view key) {
  std::size_t i = skip_blanks(t, 0);
  if (i >= t.size() || t[i] != '{') return std::nullopt;
  i = skip_blanks(t, i + 1);
  if (i < t.size() && t[i] == '}') return std::nullopt;
  while (i < t.size() && t[i] == '"') {
    const std::size_t key_end = skip_string(t, i);
    if (key_end == std::string_view::npos) return std::nullopt;
    const std::string_view name = t.substr(i + 1, key_end - i - 2);
    i = skip_blanks(t, key_end);
    if (i >= t.size() || t[i] != ':') return std::nullopt;
    i = skip_blanks(t, i + 1);
    const std::size_t value_end = skip_value(t, i);
    if (value_end == std::string_view::npos) return std::nullopt;
    if (name == key) return t.substr(i, value_end - i);
    i = skip_blanks(t, value_end);
    if (i >= t.size() || t[i] != ',') return std::nullopt;
    i = skip_blanks(t, i + 1);
  }
  return std::nullopt;
}

}  // namespace dplb::support
