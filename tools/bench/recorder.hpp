#pragma once
// Turns one response's body, piece by piece with the time each piece arrived, into a request_result:
// TTFT, inter-token gaps, usage, and whether the response was complete. No sockets: the client calls it
// after every read, and the tests call it with bytes split wherever they like.

#include <chrono>
#include <string>
#include <string_view>

#include "loadgen.hpp"
#include "sse.hpp"
#include "workload.hpp"

namespace dplb::loadgen {

class response_recorder {
 public:
  using clock = std::chrono::steady_clock;

  enum class body_kind {
    event_stream,  // a 200 answer to a streaming request: SSE events
    json,          // a 200 answer to a non-streaming request: one JSON object
    error_text,    // any other status: the start of the body goes into the error message
  };

  // `result.start` must be set; `result.status` is used for error messages. With keep_answer the generated
  // text goes into result.answer (a multi-turn session sends it back; parsing every event costs CPU, so
  // only then).
  response_recorder(request_result& result, body_kind kind, bool keep_answer = false);

  // Body bytes (de-chunked) that arrived at `at`.
  void consume(std::string_view bytes, clock::time_point at);

  // The HTTP message ended cleanly at `at`: sets e2e_s, ok and error.
  void complete(clock::time_point at);

  // The transfer broke at `at` (`why` says how): sets e2e_s and a failure that says how far it got.
  void fail(clock::time_point at, const std::string& why);

  bool saw_done() const { return done_; }

 private:
  static constexpr std::size_t max_error_text = 512;      // bytes of an error body kept
  static constexpr std::size_t max_json_body = 64 << 20;  // bytes of a non-streamed body

  void on_event(std::string_view data, clock::time_point at);
  double since_start(clock::time_point at) const;

  request_result& result_;
  body_kind kind_;
  bool keep_answer_;
  sse_reader sse_;
  std::string text_;  // the JSON body, or the start of an error body
  bool done_ = false;
  bool text_truncated_ = false;
  std::string inband_error_;  // the first in-band error event's message
  clock::time_point last_content_{};
};

}  // namespace dplb::loadgen
