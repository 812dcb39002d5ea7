#pragma once
// What a request body says about the work it asks for, read without I/O for the token-aware policy and
// for model routing: the model, how long the prompt is, how many tokens may come back and in how many
// choices, and vLLM's explicit data_parallel_rank. OpenAI/vLLM completions and chat bodies.
//
// Rules (each chosen to match what the engine itself will see):
//  - Only the top-level object's keys count: a "model" inside a message is text, not the model.
//  - A repeated key: the last one wins, as in Python's json module and pydantic, which parse the body in
//    vLLM. A later occurrence with an unusable value clears what an earlier one set.
//  - The body must be one valid JSON object (RFC 8259; invalid UTF-8 is invalid). Anything else -
//    invalid, truncated, an array, a string, empty - gives a default request_facts{} (json_object false).
//  - Prompt length:
//      "prompt": "text"               -> estimated from the text
//      "prompt": ["text", ...]        -> a batch: the sum of the estimates
//      "prompt": [1, 2, 3]            -> token ids: exact, the number of ids
//      "prompt": [[1, 2], [3]]        -> a batch of token ids: exact, the sum
//      "messages": [{"content": "text" | [{"type": "text", "text": "..."}, ...]}, ...]
//                                     -> estimated from the text of every message. A content part counts
//                                        its string "text" (whatever its "type"); images, audio and video
//                                        parts carry their payload under other keys and count 0. The chat
//                                        template's own tokens (roles, separators) are not counted.
//    "prompt" wins over "messages" in a body that has both (the body does not say which endpoint it is
//    for). A prompt that mixes text and ids is estimated (ids counted as such, text estimated). Other
//    values (numbers in a text batch, nulls, objects) count 0.
//  - Estimate: each string counts ceil(bytes / estimated_chars_per_token) tokens, bytes of its UTF-8 text
//    after JSON unescaping. Bytes, not code points: byte-level BPE tokenizers (GPT, Llama 3, Qwen) spend
//    more tokens per character on multi-byte scripts (a CJK character, 3 bytes, is about one token), so
//    bytes / 4 stays close there too while code points / 4 would undercount four-fold. Each string on
//    its own, because each prompt of a batch is tokenized on its own.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace dplb::server {

struct request_facts {
  bool json_object = false;  // the body parsed as a JSON object (else every other field is default)
  std::string model;         // top-level "model" when it is a string, else empty
  std::uint32_t prompt_tokens = 0;  // exact when the prompt is token ids, else an estimate from text length
  bool prompt_tokens_exact = false;
  // "max_completion_tokens", else "max_tokens": vLLM's chat endpoint prefers the newer name
  // (`max_completion_tokens or max_tokens`); completions bodies only have max_tokens. A non-negative
  // integer, clamped to UINT32_MAX; other values (fractions, negatives, strings, null) are ignored.
  std::optional<std::uint32_t> max_tokens;
  std::uint32_t choices = 1;  // "n" when an integer >= 1, clamped to max_choices: the cost multiplies by it
  // vLLM's body field "data_parallel_rank", when an integer. Read, not routed on: dplb pins on the
  // X-data-parallel-rank header only, since a pin names a global rank and the engine would need the field
  // rewritten to its own index, and dplb never rewrites a body (docs/configuration.md, Pinning).
  std::optional<std::int64_t> data_parallel_rank;
  // vLLM's "priority", when an integer (lower is served sooner; absent: 0): the order of dplb's queue among
  // tenants' requests. Forwarded unchanged, unless its tenant's min_priority raises it (body_with_priority).
  std::optional<std::int64_t> priority;
  bool has_priority_key = false;  // a top-level "priority", whatever its value (an integer or not)
  // Only when asked (prefix-aware): the prompt's blocks, chained by hash and seeded by the model
  // (balancer/prefix_index.hpp). Fed, in order: a text prompt's bytes after unescaping (each prompt of a
  // batch followed by a separator), a token id as its 4 bytes (so a block is 64 ids), and every message's
  // content text, each message followed by a separator (roles are not fed: the template adds the same
  // tokens around any conversation). Approximate: a repeated key adds its text again rather than replacing it.
  std::vector<std::uint64_t> prefix_chain;
  // Only when asked, as prefix_chain: the prompt's token ids, when the prompt is token ids (a batch: its
  // first prompt, which decides where the batch is cached best), each at most 32 bits (vLLM's vocabularies);
  // empty otherwise. At most max_prompt_token_ids. What KV-cache events are matched on.
  std::vector<std::uint32_t> prompt_token_ids;
  // Only when asked: vLLM's "cache_salt" when a string (it keeps the prompt's blocks apart from others').
  std::string cache_salt;

  bool operator==(const request_facts&) const = default;
};

// Rule of thumb for English text with BPE tokenizers: about 4 characters per token.
inline constexpr std::uint32_t estimated_chars_per_token = 4;
// vLLM takes any n; beyond this a request is expensive enough that the exact figure no longer matters.
inline constexpr std::uint32_t max_choices = 128;
// Token ids kept for matching: beyond, a prompt's tail is not matched (a 1 Mi-token prompt is 4 MiB of ids).
inline constexpr std::size_t max_prompt_token_ids = std::size_t{1} << 20;

// Never throws: a body that cannot be read gives request_facts{}. One pass over the body that builds
// nothing (~1 us for a 4 KiB prompt) and nests on the heap, one bit per level: deep nesting cannot
// overflow the stack.
request_facts inspect_request_body(std::string_view body, bool prefix_chain = false) noexcept;

// The body the engine gets for a request whose priority is `priority` (its tenant's min_priority raised the
// body's), given the body's `facts`, so that the engine's order (vLLM's --scheduling-policy priority) is dplb's:
//  - `unchanged`: the body says that priority already (or says none and `priority` is 0, what vLLM takes
//    for none), or is no JSON object (the engine refuses it anyway);
//  - `rewritten`, in `body`: without a "priority", the client's bytes with `"priority":N` added before the
//    closing brace; with one (an integer or anything else, repeated or spelled with escapes), the body
//    written anew with that one member set (through nlohmann, which keeps the members' order and the last
//    of repeated keys);
//  - `unusable`: the body has a "priority" but cannot be written anew (nested deeper than
//    max_rewritten_depth, or numbers nlohmann refuses, such as 1e400): the caller refuses the request, since
//    forwarding it would let its own priority through.
struct priority_body {
  enum class outcome { unchanged, rewritten, unusable };
  outcome result = outcome::unchanged;
  std::string body;
};
inline constexpr std::size_t max_rewritten_depth = 128;
priority_body body_with_priority(std::string_view body, const request_facts& facts, std::int64_t priority);

}  // namespace dplb::server
