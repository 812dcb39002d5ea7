#pragma once
// Server-sent events as an OpenAI-compatible server streams them, without sockets: a reader that
// assembles events from arbitrarily split bytes, and a cheap look at one event's JSON that needs no
// parse for the common (token) event.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace dplb::loadgen {

// Assembles `data:` lines into events. Bytes may arrive split anywhere (inside a line, between the two
// newlines) or with several events in one piece. Lines end with LF or CRLF; an event ends at an empty
// line; its data lines are joined with LF; comments (`:`) and other fields are skipped. An unterminated
// event at the end of a stream is never delivered, as the SSE spec says.
class sse_reader {
 public:
  static constexpr std::size_t default_max_line = 16 * 1024 * 1024;  // bytes; beyond it: overflowed()

  explicit sse_reader(std::size_t max_line = default_max_line) : max_line_(max_line) {}

  // Calls on_event(std::string_view data) for every event completed by these bytes. The view is valid
  // only during the call.
  template <class OnEvent>
  void feed(std::string_view bytes, OnEvent&& on_event);

  // A line longer than max_line arrived; the reader dropped it and everything after stays suspect.
  bool overflowed() const { return overflowed_; }
  // Part of an event is buffered (the stream stopped in the middle of one).
  bool mid_event() const { return !partial_line_.empty() || has_data_; }

 private:
  // Handles one complete line without its terminator; true when it ends an event with data.
  bool take_line(std::string_view line);

  std::string partial_line_;  // a line whose LF has not arrived yet
  std::string data_;          // the data of the event being assembled (capacity kept between events)
  bool has_data_ = false;
  bool overflowed_ = false;
  std::size_t max_line_;
};

template <class OnEvent>
void sse_reader::feed(std::string_view bytes, OnEvent&& on_event) {
  while (!bytes.empty()) {
    const auto lf = bytes.find('\n');
    if (lf == std::string_view::npos) {
      if (partial_line_.size() + bytes.size() > max_line_) {
        overflowed_ = true;
        partial_line_.clear();
      } else {
        partial_line_.append(bytes);
      }
      return;
    }
    std::string_view line = bytes.substr(0, lf);
    bytes.remove_prefix(lf + 1);
    if (!partial_line_.empty()) {
      partial_line_.append(line);
      line = partial_line_;
    }
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (take_line(line)) {
      on_event(std::string_view(data_));
      data_.clear();
      has_data_ = false;
    }
    partial_line_.clear();
  }
}

struct token_usage {
  std::uint64_t prompt_tokens = 0;
  std::uint64_t completion_tokens = 0;
};

// What one event's data says, judged from its bytes (vLLM sends compact JSON).
struct event_info {
  bool done = false;     // `[DONE]`
  bool content = false;  // `"choices":[` with something in it: a token (or chat's role) event
  bool error = false;    // an in-band error object (`{"error":...}` or the older `"object":"error"`)
  std::optional<token_usage> usage;  // a `"usage":{...}` object (not `"usage":null`)
};

event_info inspect_event(std::string_view data);

// prompt_tokens and completion_tokens of the first `"usage":{` object in compact JSON text, if both
// are there as plain integers.
std::optional<token_usage> find_usage(std::string_view json);

}  // namespace dplb::loadgen
