#pragma once
// Prefill/decode disaggregation's two legs, as the bodies dplb sends: vLLM's disaggregated proxy runs each
// completions or chat request first on a prefill instance, which computes the prompt's KV cache and says
// where it holds it (kv_transfer_params), then on a decode instance, which pulls those blocks and generates.
//   prefill leg: the client's body with kv_transfer_params asking for a remote decode, "stream": false,
//                "max_tokens": 1 ("max_completion_tokens": 1 too when the client gave that key), and without
//                stream_options, min_tokens and min_completion_tokens (a 1-token answer, in one piece);
//   decode leg:  the client's body as it came, plus the prefill answer's kv_transfer_params object verbatim
//                (every key, byte for byte: its numbers and key order are the engine's business).
// Pure functions of the texts; never throw.

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace dplb::pd {

// Bodies nested deeper than this are refused: the prefill body is rebuilt through a JSON tree, whose copy and
// dump recurse once per level. Real requests nest a handful of levels (chat content parts: 5).
inline constexpr std::size_t max_body_nesting = 64;

// The prefill leg's body; nullopt when the client's body is not a JSON object (or nests too deep), or does not
// start with the object's brace (a byte order mark before it: the decode body is written into these bytes).
std::optional<std::string> prefill_body(std::string_view client_body);

// The raw text of a prefill answer's top-level kv_transfer_params object; nullopt when it has none, or when
// it is not an object (then no decode leg can run: the engine is not a disaggregated prefill instance).
std::optional<std::string_view> kv_transfer_params_of(std::string_view prefill_answer);

// The decode leg's body: `client_body` with `kv_transfer_params` set to `params` (raw JSON object text,
// inserted as it is, before the body's closing brace: the rest stays byte for byte the client's). A client's
// own kv_transfer_params is replaced. The body is taken as the object prefill_body() accepted (only its
// braces are checked here); nullopt when it is not braced.
std::optional<std::string> decode_body(std::string_view client_body, std::string_view params);

// Whether a client's body could give the engines a kv_transfer_params of its own: in a disaggregated cluster
// those are dplb's to write (they tell an engine to hold blocks for a pull, or to pull blocks from a host), so
// such a body is refused. The engines read bodies with Python's json, which is lenient where a plain key search
// is not, so the scan is too: every top-level key is compared once unescaped ("kv_transfer_p\u0061rams"), every
// occurrence of it (a duplicate key cannot hide one: Python keeps the last), after an optional UTF-8 byte order
// mark; values are only delimited (NaN and the like pass). A body in UTF-16 or UTF-32 (a byte order mark for
// them, or a NUL among its first four bytes), which Python's json decodes and this scan cannot read, counts as
// one that does. Anything else that is no JSON object does not (an engine refuses it).
bool sets_kv_transfer_params(std::string_view client_body);

}  // namespace dplb::pd
