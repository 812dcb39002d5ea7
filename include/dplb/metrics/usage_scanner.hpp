#pragma once
// Finds the token counts of an OpenAI-style response ("usage": {"prompt_tokens": P, ...,
// "completion_tokens": C}) in the body bytes as they are relayed, without buffering the body: the bytes
// are fed piece by piece, in whatever splits the network produced, and the scanner keeps only a few
// bytes of state. Works the same for a JSON response and for an SSE stream whose usage chunk comes
// last (stream_options.include_usage); with continuous usage stats the last value seen wins.
//
// Why matching the raw key is safe: inside a JSON string every '"' is escaped, so the byte sequence
// `"prompt_tokens"` followed by ':' can only be an object key, never text the model generated.
//
// Asked to (count_stream_events), it also counts an SSE stream's events as they pass: every line that begins
// with `data:` but for `data: [DONE]`. vLLM sends one event per engine step and choice, each carrying the
// tokens of that step: one, without speculative decoding. So the events are the completion tokens generated
// so far, give or take a chat stream's first event (the role, no token): what a tenant's token budget is
// charged for a stream that reports no usage. Inside a JSON string a newline is escaped, so `data:` at a
// line's start is never text the model generated.

#include <cstdint>
#include <optional>
#include <string_view>

namespace dplb::metrics {

class usage_scanner {
 public:
  void feed(std::string_view bytes) noexcept;

  std::optional<std::uint64_t> prompt_tokens() const noexcept { return prompt_; }
  std::optional<std::uint64_t> completion_tokens() const noexcept { return completion_; }

  // Counts the SSE events of what is fed from now on (off by default: a cost only a token budget needs).
  void count_stream_events() noexcept { counting_events_ = true; }
  // `data:` events other than `data: [DONE]` seen so far (0 unless counted).
  std::uint64_t stream_events() const noexcept { return events_; }

 private:
  // Where the event counter stands: at the start of a line, inside "data:" (prefix_matched_ bytes of it), just
  // past it (a space may follow), or in the rest of a line.
  enum class line : std::uint8_t { start, prefix, after_prefix, after_space, rest };
  void count_events(std::string_view bytes) noexcept;
  void first_value_byte(char c) noexcept;

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
  bool counting_events_ = false;
  line line_ = line::start;
  std::uint8_t prefix_matched_ = 0;
  std::uint64_t events_ = 0;
};

}  // namespace dplb::metrics
