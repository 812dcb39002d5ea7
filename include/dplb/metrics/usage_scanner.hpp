#pragma once
// Finds the token counts of an OpenAI-style response ("usage": {"prompt_tokens": P, ...,
// "completion_tokens": C}) in the body bytes as they are relayed, without buffering the body: the bytes
// are fed piece by piece, in whatever splits the network produced, and the scanner keeps only a few
// bytes of state. Works the same for a JSON response and for an SSE stream whose usage chunk comes
// last (stream_options.include_usage); with continuous usage stats the last value seen wins.
//
// Why matching the raw key is safe: inside a JSON string every '"' is escaped, so the byte sequence
// `"prompt_tokens"` followed by ':' can only be an object key, never text the model generated.

#include <cstdint>
#include <optional>
#include <string_view>

namespace dplb::metrics {

class usage_scanner {
 public:
  void feed(std::string_view bytes) noexcept;

  std::optional<std::uint64_t> prompt_tokens() const noexcept { return prompt_; }
  std::optional<std::uint64_t> completion_tokens() const noexcept { return completion_; }

 private:
  enum class state : std::uint8_t { scan, key, before_colon, before_value, number };
  enum class which : std::uint8_t { prompt, completion };

  void step(char c) noexcept;
  void restart_with(char c) noexcept;

  state state_ = state::scan;
  which key_ = which::prompt;
  std::uint8_t matched_ = 0;  // characters of the key name matched so far
  std::uint64_t value_ = 0;
  std::optional<std::uint64_t> prompt_;
  std::optional<std::uint64_t> completion_;
};

}  // namespace dplb::metrics
