#include "sse.hpp"

#include <charconv>

namespace dplb::loadgen {

bool sse_reader::take_line(std::string_view line) {
  if (line.empty()) return has_data_;
  if (line.front() == ':') return false;  // a comment (keep-alive ping)
  const auto colon = line.find(':');
  const std::string_view field = line.substr(0, colon);
  if (field != "data") return false;  // event:, id:, retry: carry nothing a benchmark needs
  std::string_view value = colon == std::string_view::npos ? std::string_view{} : line.substr(colon + 1);
  if (!value.empty() && value.front() == ' ') value.remove_prefix(1);
  if (has_data_) data_.push_back('\n');
  data_.append(value);
  has_data_ = true;
  return false;
}

namespace {

std::optional<std::uint64_t> integer_after(std::string_view text, std::string_view key) {
  const auto at = text.find(key);
  if (at == std::string_view::npos) return std::nullopt;
  const char* first = text.data() + at + key.size();
  const char* last = text.data() + text.size();
  while (first != last && *first == ' ') ++first;
  std::uint64_t value = 0;
  const auto [end, ec] = std::from_chars(first, last, value);
  if (ec != std::errc{} || end == first) return std::nullopt;
  return value;
}

}  // namespace

std::optional<token_usage> find_usage(std::string_view json) {
  constexpr std::string_view key = "\"usage\":{";
  const auto at = json.find(key);
  if (at == std::string_view::npos) return std::nullopt;
  // Confine the key search to the usage object: `prompt_tokens_details` may nest one level, and a
  // key of the same name elsewhere in the event must not be mistaken for it.
  const auto open = at + key.size() - 1;
  std::size_t depth = 0;
  std::size_t close = open;
  for (; close < json.size(); ++close) {
    if (json[close] == '{') ++depth;
    else if (json[close] == '}' && --depth == 0) break;
  }
  const std::string_view object = json.substr(open, close - open);
  const auto prompt = integer_after(object, "\"prompt_tokens\":");
  const auto completion = integer_after(object, "\"completion_tokens\":");
  if (!prompt || !completion) return std::nullopt;
  return token_usage{*prompt, *completion};
}

event_info inspect_event(std::string_view data) {
  event_info info;
  if (data == "[DONE]") {
    info.done = true;
    return info;
  }
  constexpr std::string_view choices = "\"choices\":[";
  const auto at = data.find(choices);
  info.content = at != std::string_view::npos && at + choices.size() < data.size() &&
                 data[at + choices.size()] != ']';
  info.error = data.starts_with("{\"error\"") || data.find("\"object\":\"error\"") != std::string_view::npos;
  info.usage = find_usage(data);
  return info;
}

}  // namespace dplb::loadgen
