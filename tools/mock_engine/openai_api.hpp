#pragma once
// The OpenAI-compatible side of the mock, shaped after vLLM: request validation and every JSON body the
// generation endpoints send. Pure functions over strings; the session only moves the bytes.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "kv_block_pool.hpp"
#include "kv_transfer.hpp"

namespace dplb::mock {

enum class api_kind { completions, chat };

// A request that passed validation: all the mock needs to fake vLLM's answer.
struct generation_request {
  api_kind kind = api_kind::completions;
  std::uint64_t prompt_tokens = 0;  // see count_words
  // With --simulate: the prompt's KV blocks chained by hash, for prefix caching (see
  // parse_generation_request); the scheduler extends it with the tokens the request generates.
  sim::chain_builder prompt_chain;
  std::uint64_t max_tokens = 1;     // tokens to generate, >= 1; all of them are generated
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  // kv_transfer_params, read only for --kv-role prefill or decode (the other role's flags included).
  std::optional<kv_transfer_params> kv_transfer;
};

// A vLLM error answer: HTTP status and the JSON body.
struct api_error {
  unsigned status = 400;
  std::string body;
};

// Whitespace-separated words in `text`: the mock's deterministic stand-in for a tokenizer.
std::uint64_t count_words(std::string_view text) noexcept;

// The max_model_len the mock announces (/v1/models, /tokenize).
inline constexpr std::uint64_t max_model_len = 8192;

// Validates a POST body as vLLM would: Content-Type application/json, a JSON object, `model` (if
// present) equal to served_model, max_tokens (chat: max_completion_tokens first) >= 1, `stream` a bool,
// stream_options only with stream=true, a `prompt` (completions) or `messages` (chat).
// Token ids given in a prompt must be integers in [0, 2^32) (else 400, as vLLM refuses ids outside its
// vocabulary); `cache_salt`, if present and not null, a non-empty string.
// With block_size > 0 it also hashes the prompt's blocks of that many tokens (prompt_chain, seeded by
// the cache_salt; keeping the tokens if `keep_tokens`, for the KV-cache events): the tokens are the ids
// a prompt gives, else one pseudo-token per whitespace-separated word (sim::word_token), over the
// prompt's parts or the messages' contents in order (roles are not tokens).
// With read_kv_transfer it also reads kv_transfer_params (read_kv_transfer_params; a bad one is a 400).
std::variant<generation_request, api_error> parse_generation_request(api_kind kind,
                                                                     std::string_view content_type,
                                                                     std::string_view body,
                                                                     std::string_view served_model,
                                                                     std::uint64_t default_max_tokens,
                                                                     std::uint32_t block_size = 0,
                                                                     bool keep_tokens = false,
                                                                     bool read_kv_transfer = false);

// POST /tokenize, vLLM's: the body's `messages` (as chat tokenizes them), else its `prompt` (as
// completions does), become the token ids the engine would prefill, the same ids its KV-cache events
// carry. The answer's body {"count":N,"max_model_len":L,"tokens":[...],"token_strs":null}, or the error
// (400; 404 for another model). Other fields (add_generation_prompt, ...) are ignored.
std::variant<std::string, api_error> tokenize_request(std::string_view content_type, std::string_view body,
                                                      std::string_view served_model);

// vLLM's error JSON: {"error":{"message":..,"type":..,"param":..,"code":..}}; empty param prints null.
std::string error_body(std::string_view message, std::string_view type, unsigned code,
                       std::string_view param = {});

// The bodies of one generation response. Events are complete SSE events ("data: {...}\n\n").
class response_renderer {
 public:
  // id_suffix: the x-request-id value, or a counter; created: Unix seconds.
  response_renderer(api_kind kind, std::string_view id_suffix, std::int64_t created, std::string_view model);

  std::string role_event() const;            // chat only: delta {role:assistant, content:""}
  std::string token_event(bool last) const;  // one " tok"; last carries finish_reason "length"
  std::string usage_event(std::uint64_t prompt_tokens, std::uint64_t completion_tokens) const;
  // Non-stream. A prefill engine's answer also carries `kv_transfer` as its top-level
  // "kv_transfer_params" (kv_transfer_answer), as vLLM's does.
  std::string full_response(std::uint64_t prompt_tokens, std::uint64_t completion_tokens,
                            const kv_transfer_params* kv_transfer = nullptr) const;

 private:
  api_kind kind_;
  std::string id_;
  std::int64_t created_;
  std::string model_;
};

inline constexpr std::string_view done_event = "data: [DONE]\n\n";

std::string models_body(std::string_view model, std::int64_t created);  // GET /v1/models
std::string version_body();                                             // GET /version

}  // namespace dplb::mock
