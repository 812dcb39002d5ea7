#include "openai_api.hpp"

#include <algorithm>
#include <cctype>
#include <nlohmann/json.hpp>
#include <optional>

#include "kv_block_pool.hpp"

namespace dplb::mock {
namespace {

using ordered_json = nlohmann::ordered_json;
using json = nlohmann::json;

constexpr std::string_view token_text = " tok";

// Client-supplied strings (ids, model names) may hold invalid UTF-8; dump() would throw on them.
std::string dump(const ordered_json& value) {
  return value.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string sse(const ordered_json& value) {
  std::string event = "data: ";
  event += dump(value);
  event += "\n\n";
  return event;
}

api_error bad_request(std::string_view message) { return {400, error_body(message, "BadRequestError", 400)}; }

bool is_json_media_type(std::string_view content_type) {
  auto media = content_type.substr(0, content_type.find(';'));
  while (!media.empty() && std::isspace(static_cast<unsigned char>(media.back())) != 0)
    media.remove_suffix(1);
  while (!media.empty() && std::isspace(static_cast<unsigned char>(media.front())) != 0)
    media.remove_prefix(1);
  constexpr std::string_view expected = "application/json";
  return std::equal(media.begin(), media.end(), expected.begin(), expected.end(),
                    [](char a, char b) { return std::tolower(static_cast<unsigned char>(a)) == b; });
}

// Where a prompt's tokens go, in order: always counted; fed to the request's block chain (with
// --simulate) and listed (/tokenize) when asked. One tokenizer feeds all three, so that /tokenize says
// exactly what the engine prefills and hashes.
struct token_sink {
  sim::chain_builder* chain = nullptr;
  std::vector<sim::token_id>* list = nullptr;
  std::uint64_t count = 0;

  bool wants_ids() const { return chain != nullptr || list != nullptr; }
  void add(sim::token_id token) {
    ++count;
    if (chain != nullptr) chain->add(token);
    if (list != nullptr) list->push_back(token);
  }
};

// One pseudo-token per whitespace-separated word of `text` (sim::word_token).
void tokenize_text(std::string_view text, token_sink& sink) {
  if (!sink.wants_ids()) {  // counting only: no hashing
    sink.count += count_words(text);
    return;
  }
  std::size_t i = 0;
  while (i < text.size()) {
    while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i])) != 0) ++i;
    const std::size_t start = i;
    while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i])) == 0) ++i;
    if (i == start) break;
    sink.add(sim::word_token(text.substr(start, i - start)));
  }
}

// A token id as given: an integer that fits 32 bits (vLLM refuses an id outside its vocabulary, and
// its KV events carry 32-bit ids), else 400.
std::optional<api_error> add_token_id(const json& id, token_sink& sink) {
  if (!id.is_number_integer()) return bad_request("prompt token ids must be integers");
  if (!id.is_number_unsigned() || id.get<std::uint64_t>() > UINT32_MAX)
    return bad_request("Token id " + id.dump() + " is out of vocabulary");
  sink.add(static_cast<sim::token_id>(id.get<std::uint64_t>()));
  return std::nullopt;
}

// A completions prompt: a string, an array of strings, or token ids (a flat array, or arrays of them).
std::optional<api_error> tokenize_prompt(const json& prompt, token_sink& sink) {
  if (prompt.is_string()) {
    tokenize_text(prompt.get_ref<const std::string&>(), sink);
    return std::nullopt;
  }
  if (!prompt.is_array() || prompt.empty()) return bad_request("prompt must be a string or a non-empty array");
  for (const auto& part : prompt) {
    if (part.is_string()) {
      tokenize_text(part.get_ref<const std::string&>(), sink);
    } else if (part.is_number()) {
      if (auto error = add_token_id(part, sink)) return error;
    } else if (part.is_array()) {
      for (const auto& id : part) {
        if (auto error = add_token_id(id, sink)) return error;
      }
    } else {
      return bad_request("prompt must be a string, an array of strings or an array of token ids");
    }
  }
  return std::nullopt;
}

// Every message's content in order: a string, or text parts ({"type":"text","text":...}). Roles and
// the chat template are not tokens.
std::optional<api_error> tokenize_messages(const json& messages, token_sink& sink) {
  if (!messages.is_array()) return bad_request("messages must be an array");
  for (const auto& message : messages) {
    if (!message.is_object()) return bad_request("each message must be an object");
    const auto content = message.find("content");
    if (content == message.end() || content->is_null()) continue;
    if (content->is_string()) {
      tokenize_text(content->get_ref<const std::string&>(), sink);
    } else if (content->is_array()) {
      for (const auto& part : *content) {
        if (!part.is_object()) continue;
        const auto text = part.find("text");
        if (text != part.end() && text->is_string()) tokenize_text(text->get_ref<const std::string&>(), sink);
      }
    } else {
      return bad_request("message content must be a string or an array of parts");
    }
  }
  return std::nullopt;
}

std::optional<api_error> tokenize_input(api_kind kind, const json& input, token_sink& sink) {
  return kind == api_kind::chat ? tokenize_messages(input, sink) : tokenize_prompt(input, sink);
}

// vLLM's cache_salt: absent or null, else a non-empty string.
std::variant<std::string, api_error> cache_salt_of(const json& request) {
  const auto salt = request.find("cache_salt");
  if (salt == request.end() || salt->is_null()) return std::string{};
  if (!salt->is_string() || salt->get_ref<const std::string&>().empty())
    return bad_request("Parameter 'cache_salt' must be a non-empty string if provided.");
  return salt->get<std::string>();
}

// The checks every JSON endpoint of vLLM's makes first: the media type, a JSON object, the model.
std::variant<json, api_error> parse_json_request(std::string_view content_type, std::string_view body,
                                                 std::string_view served_model) {
  if (!is_json_media_type(content_type)) {
    return bad_request("Unsupported Media Type: Only 'application/json' is allowed");
  }
  json request = json::parse(body, nullptr, false);
  if (request.is_discarded()) return bad_request("JSON decode error: the request body is not valid JSON");
  if (!request.is_object()) return bad_request("The request body must be a JSON object");
  if (const auto model = request.find("model"); model != request.end() && !model->is_null()) {
    if (!model->is_string()) return bad_request("model must be a string");
    const auto& name = model->get_ref<const std::string&>();
    if (name != served_model) {
      return api_error{404,
                       error_body("The model `" + name + "` does not exist.", "NotFoundError", 404, "model")};
    }
  }
  return request;
}

// max_completion_tokens wins over max_tokens in chat, as in vLLM; null means unset.
std::variant<std::uint64_t, api_error> max_tokens_of(api_kind kind, const json& request,
                                                     std::uint64_t fallback) {
  const json* value = nullptr;
  for (const char* key : {"max_completion_tokens", "max_tokens"}) {
    if (kind == api_kind::completions && std::string_view(key) == "max_completion_tokens") continue;
    const auto found = request.find(key);
    if (found != request.end() && !found->is_null()) {
      value = &*found;
      break;
    }
  }
  if (value == nullptr) return fallback;
  if (!value->is_number_integer()) return bad_request("max_tokens must be an integer");
  if (value->is_number_unsigned()) {
    const auto n = value->get<std::uint64_t>();
    if (n >= 1) return n;
  }
  return bad_request("max_tokens must be at least 1, got " + value->dump() + ".");
}

ordered_json header(std::string_view id, std::string_view object, std::int64_t created,
                    std::string_view model) {
  ordered_json j;
  j["id"] = id;
  j["object"] = object;
  j["created"] = created;
  j["model"] = model;
  return j;
}

ordered_json usage(std::uint64_t prompt_tokens, std::uint64_t completion_tokens) {
  ordered_json u;
  u["prompt_tokens"] = prompt_tokens;
  u["total_tokens"] = prompt_tokens + completion_tokens;
  u["completion_tokens"] = completion_tokens;
  return u;
}

}  // namespace

std::uint64_t count_words(std::string_view text) noexcept {
  std::uint64_t words = 0;
  bool in_word = false;
  for (const char c : text) {
    const bool space = std::isspace(static_cast<unsigned char>(c)) != 0;
    if (!space && !in_word) ++words;
    in_word = !space;
  }
  return words;
}

std::variant<generation_request, api_error> parse_generation_request(api_kind kind,
                                                                     std::string_view content_type,
                                                                     std::string_view body,
                                                                     std::string_view served_model,
                                                                     std::uint64_t default_max_tokens,
                                                                     std::uint32_t block_size,
                                                                     bool keep_tokens, bool read_kv_transfer) {
  auto parsed_json = parse_json_request(content_type, body, served_model);
  if (auto* error = std::get_if<api_error>(&parsed_json)) return std::move(*error);
  const auto& request = std::get<json>(parsed_json);

  generation_request parsed;
  parsed.kind = kind;

  const auto max_tokens = max_tokens_of(kind, request, default_max_tokens);
  if (const auto* error = std::get_if<api_error>(&max_tokens)) return *error;
  parsed.max_tokens = std::get<std::uint64_t>(max_tokens);

  if (const auto stream = request.find("stream"); stream != request.end() && !stream->is_null()) {
    if (!stream->is_boolean()) return bad_request("stream must be a boolean");
    parsed.stream = stream->get<bool>();
  }
  if (const auto options = request.find("stream_options"); options != request.end() && !options->is_null()) {
    if (!parsed.stream) return bad_request("Stream options can only be defined when `stream=True`.");
    if (!options->is_object()) return bad_request("stream_options must be an object");
    if (const auto include = options->find("include_usage");
        include != options->end() && !include->is_null()) {
      if (!include->is_boolean()) return bad_request("stream_options.include_usage must be a boolean");
      parsed.include_usage = include->get<bool>();
    }
  }

  const char* input_key = kind == api_kind::chat ? "messages" : "prompt";
  const auto input = request.find(input_key);
  if (input == request.end()) return bad_request(std::string("Field required: ") + input_key);
  auto salt = cache_salt_of(request);
  if (auto* error = std::get_if<api_error>(&salt)) return std::move(*error);
  std::optional<sim::chain_builder> chain;
  if (block_size != 0) chain.emplace(block_size, std::get<std::string>(salt), keep_tokens);
  token_sink sink;
  sink.chain = chain ? &*chain : nullptr;
  if (auto error = tokenize_input(kind, *input, sink)) return std::move(*error);
  parsed.prompt_tokens = sink.count;
  if (chain) parsed.prompt_chain = std::move(*chain);
  if (read_kv_transfer) {
    auto kv_transfer = read_kv_transfer_params(request);
    if (auto* error = std::get_if<std::string>(&kv_transfer)) return bad_request(*error);
    parsed.kv_transfer = std::move(std::get<std::optional<kv_transfer_params>>(kv_transfer));
  }
  return parsed;
}

std::variant<std::string, api_error> tokenize_request(std::string_view content_type, std::string_view body,
                                                      std::string_view served_model) {
  auto parsed_json = parse_json_request(content_type, body, served_model);
  if (auto* error = std::get_if<api_error>(&parsed_json)) return std::move(*error);
  const auto& request = std::get<json>(parsed_json);
  // vLLM's TokenizeRequest is a chat request when it has messages, else a completion request.
  const auto messages = request.find("messages");
  const bool chat = messages != request.end();
  const auto input = chat ? messages : request.find("prompt");
  if (input == request.end()) return bad_request("Field required: prompt or messages");
  std::vector<sim::token_id> tokens;
  token_sink sink;
  sink.list = &tokens;
  if (auto error = tokenize_input(chat ? api_kind::chat : api_kind::completions, *input, sink)) return std::move(*error);
  ordered_json answer;
  answer["count"] = tokens.size();
  answer["max_model_len"] = max_model_len;
  answer["tokens"] = std::move(tokens);
  answer["token_strs"] = nullptr;
  return dump(answer);
}

std::string error_body(std::string_view message, std::string_view type, unsigned code,
                       std::string_view param) {
  ordered_json error;
  error["message"] = message;
  error["type"] = type;
  error["param"] = param.empty() ? ordered_json(nullptr) : ordered_json(param);
  error["code"] = code;
  ordered_json body;
  body["error"] = std::move(error);
  return dump(body);
}

response_renderer::response_renderer(api_kind kind, std::string_view id_suffix, std::int64_t created,
                                     std::string_view model)
    : kind_(kind),
      id_((kind == api_kind::chat ? "chatcmpl-" : "cmpl-") + std::string(id_suffix)),
      created_(created),
      model_(model) {}

std::string response_renderer::role_event() const {
  ordered_json choice;
  choice["index"] = 0;
  choice["delta"] = {{"role", "assistant"}, {"content", ""}};
  choice["logprobs"] = nullptr;
  choice["finish_reason"] = nullptr;
  auto event = header(id_, "chat.completion.chunk", created_, model_);
  event["choices"] = ordered_json::array({std::move(choice)});
  return sse(event);
}

std::string response_renderer::token_event(bool last) const {
  ordered_json choice;
  choice["index"] = 0;
  if (kind_ == api_kind::chat) {
    // vLLM dumps chat chunks with exclude_unset: stop_reason appears only on the finishing chunk.
    choice["delta"] = {{"content", token_text}};
    choice["logprobs"] = nullptr;
    choice["finish_reason"] = last ? ordered_json("length") : ordered_json(nullptr);
    if (last) choice["stop_reason"] = nullptr;
  } else {
    choice["text"] = token_text;
    choice["logprobs"] = nullptr;
    choice["finish_reason"] = last ? ordered_json("length") : ordered_json(nullptr);
    choice["stop_reason"] = nullptr;
  }
  auto event =
      header(id_, kind_ == api_kind::chat ? "chat.completion.chunk" : "text_completion", created_, model_);
  event["choices"] = ordered_json::array({std::move(choice)});
  return sse(event);
}

std::string response_renderer::usage_event(std::uint64_t prompt_tokens,
                                           std::uint64_t completion_tokens) const {
  auto event =
      header(id_, kind_ == api_kind::chat ? "chat.completion.chunk" : "text_completion", created_, model_);
  event["choices"] = ordered_json::array();
  event["usage"] = usage(prompt_tokens, completion_tokens);
  return sse(event);
}

std::string response_renderer::full_response(std::uint64_t prompt_tokens, std::uint64_t completion_tokens,
                                             const kv_transfer_params* kv_transfer) const {
  std::string text;
  text.reserve(token_text.size() * completion_tokens);
  for (std::uint64_t i = 0; i < completion_tokens; ++i) text += token_text;

  ordered_json choice;
  choice["index"] = 0;
  ordered_json body;
  auto full_usage = usage(prompt_tokens, completion_tokens);
  full_usage["prompt_tokens_details"] = nullptr;
  if (kind_ == api_kind::chat) {
    body = header(id_, "chat.completion", created_, model_);
    ordered_json message;
    message["role"] = "assistant";
    message["content"] = std::move(text);
    message["tool_calls"] = ordered_json::array();
    choice["message"] = std::move(message);
    choice["logprobs"] = nullptr;
    choice["finish_reason"] = "length";
    choice["stop_reason"] = nullptr;
    body["choices"] = ordered_json::array({std::move(choice)});
    body["usage"] = std::move(full_usage);
    body["prompt_logprobs"] = nullptr;
  } else {
    body = header(id_, "text_completion", created_, model_);
    choice["text"] = std::move(text);
    choice["logprobs"] = nullptr;
    choice["finish_reason"] = "length";
    choice["stop_reason"] = nullptr;
    choice["prompt_logprobs"] = nullptr;
    body["choices"] = ordered_json::array({std::move(choice)});
    body["usage"] = std::move(full_usage);
  }
  if (kv_transfer != nullptr) body["kv_transfer_params"] = kv_transfer_answer(*kv_transfer);
  return dump(body);
}

std::string models_body(std::string_view model, std::int64_t created) {
  ordered_json card;
  card["id"] = model;
  card["object"] = "model";
  card["created"] = created;
  card["owned_by"] = "vllm";
  card["root"] = model;
  card["parent"] = nullptr;
  card["max_model_len"] = max_model_len;
  ordered_json body;
  body["object"] = "list";
  body["data"] = ordered_json::array({std::move(card)});
  return dump(body);
}

std::string version_body() { return R"({"version":"0.0.0-mock"})"; }

}  // namespace dplb::mock
