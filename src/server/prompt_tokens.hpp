#pragma once
// The token ids of a text prompt, from the engine that will serve it (--tokenize engine): what dplb sends
// to vLLM's POST /tokenize for a request's body, and how it reads the answer. vLLM's /tokenize takes a
// completions-style {"model", "prompt"} or a chat-style {"model", "messages", ...} and answers
// {"count", "max_model_len", "tokens": [...]}: the ids the engine prefills for that request, the chat
// template applied as for serving, so the blocks they make are the blocks the engine caches. Pure.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace dplb::server {

// What is sent to be tokenized at most: a body beyond (8 MiB, about 2M tokens of text) or nested deeper
// (arrays and objects within each other; chat messages nest 4 or 5 deep) is matched without its ids.
inline constexpr std::size_t max_tokenized_body_bytes = std::size_t{8} << 20;
inline constexpr std::size_t max_tokenized_nesting = 64;

// The /tokenize body for a request body: its "model" and its text "prompt" (a batch: the first prompt,
// which decides where the batch goes) with "add_special_tokens"; or its "messages" with the fields that
// change what the chat template makes of them (add_generation_prompt, continue_final_message,
// add_special_tokens, chat_template, chat_template_kwargs, tools, documents). nullopt when the body has
// neither a text prompt nor messages (token ids need no tokenizer), is not a JSON object, or is beyond the
// bounds above.
std::optional<std::string> tokenize_request_body(std::string_view body);

// The "tokens" of a /tokenize answer, each a non-negative id of at most 32 bits; at most `max_tokens` are
// kept. nullopt when the answer is not one.
std::optional<std::vector<std::uint32_t>> tokens_of_tokenize_answer(std::string_view answer, std::size_t max_tokens);

}  // namespace dplb::server
