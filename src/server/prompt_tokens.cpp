#include "prompt_tokens.hpp"

#include <algorithm>
#include <array>
#include <limits>
#include <nlohmann/json.hpp>

#include "dplb/support/json_text.hpp"

namespace dplb::server {

namespace {

using json = nlohmann::json;

// The chat request's fields that change the ids the template makes (vLLM's TokenizeChatRequest).
constexpr std::array<std::string_view, 7> chat_template_fields{
    "add_generation_prompt", "continue_final_message", "add_special_tokens", "chat_template",
    "chat_template_kwargs",  "tools",                  "documents"};

}  // namespace

std::optional<std::string> tokenize_request_body(std::string_view body) {
  // nlohmann's parser is iterative, but copying and dumping a tree recurse once per level: a body nested tens
  // of thousands deep (tens of KB) would overflow a worker's stack. Real messages nest a handful of levels.
  if (body.size() > max_tokenized_body_bytes ||
      support::json_nesting_depth(body, max_tokenized_nesting) > max_tokenized_nesting) {
    return std::nullopt;
  }
  json request = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (!request.is_object()) return std::nullopt;
  json out = json::object();
  if (const auto model = request.find("model"); model != request.end() && model->is_string()) out["model"] = *model;
  // "prompt" wins over "messages", as for the request's other facts.
  if (const auto prompt = request.find("prompt"); prompt != request.end()) {
    json* text = &*prompt;
    if (prompt->is_array() && !prompt->empty()) text = &prompt->front();
    if (!text->is_string()) return std::nullopt;  // token ids, or nothing a tokenizer reads
    out["prompt"] = std::move(*text);
    if (const auto special = request.find("add_special_tokens"); special != request.end()) {
      out["add_special_tokens"] = *special;
    }
    return out.dump();
  }
  const auto messages = request.find("messages");
  if (messages == request.end() || !messages->is_array()) return std::nullopt;
  out["messages"] = std::move(*messages);
  for (const auto field : chat_template_fields) {
    if (const auto value = request.find(field); value != request.end()) out[std::string(field)] = std::move(*value);
  }
  return out.dump();
}

std::optional<std::vector<std::uint32_t>> tokens_of_tokenize_answer(std::string_view answer, std::size_t max_tokens) {
  const json parsed = json::parse(answer, nullptr, /*allow_exceptions=*/false);
  if (!parsed.is_object()) return std::nullopt;
  const auto tokens = parsed.find("tokens");
  if (tokens == parsed.end() || !tokens->is_array()) return std::nullopt;
  std::vector<std::uint32_t> out;
  out.reserve(std::min(tokens->size(), max_tokens));
  for (const auto& id : *tokens) {
    // nlohmann reads a non-negative integer as unsigned: anything else is not a token id.
    if (!id.is_number_unsigned() || id.get<std::uint64_t>() > std::numeric_limits<std::uint32_t>::max()) {
      return std::nullopt;
    }
    if (out.size() < max_tokens) out.push_back(static_cast<std::uint32_t>(id.get<std::uint64_t>()));
  }
  return out;
}

}  // namespace dplb::server
