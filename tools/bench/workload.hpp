#pragma once
// What a run sends and when, without sockets: per-request lengths, random-word prompts, request bodies
// and arrival times, all a function of the seed so two runs with one seed send the same thing.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "loadgen.hpp"

namespace dplb::loadgen {

struct request_plan {
  std::size_t input_words = 0;  // the request's own prompt words (after its group's prefix, if any)
  std::size_t max_tokens = 0;   // output length asked for
  std::uint64_t prompt_seed = 0;
  int prefix_group = -1;        // -1: no shared prefix
  std::size_t prefix_words = 0; // the group's prefix length, 0 without one
  std::uint64_t prefix_seed = 0;  // the group's: the same for every request of the group

  std::size_t prompt_words() const { return prefix_words + input_words; }
};

// Lengths drawn uniformly from [len * (1 - ratio), len * (1 + ratio)] (floor, ceil; at least 1), as
// vllm's random dataset does; len is the long class's for the requests drawn into it (shape.long_share).
// Which requests are long comes from a stream of its own: every request keeps the prompt seed it has
// without a long class, and with a range ratio of 0 the others keep their lengths too.
std::vector<request_plan> plan_requests(const request_shape& shape, std::size_t count, std::uint64_t seed);

// The seed of a prefix group's words: a function of the run's seed and the group only, so the group's
// prefix is the same whatever the request count, the lengths or the other options.
std::uint64_t group_prefix_seed(std::uint64_t seed, std::size_t group);

// Seconds after the start at which each request is due. For an infinite rate, request k at
// k * spread_s / count (all 0 without a spread); otherwise the first at 0 and gamma-distributed gaps
// (shape = burstiness, mean = 1 / rate) after it, and spread_s must be 0.
std::vector<double> arrival_offsets(std::size_t count, double rate, double burstiness, std::uint64_t seed,
                                    double spread_s = 0.0);

// Appends `words` space-separated lowercase words (no characters JSON must escape).
void append_prompt(std::string& out, std::size_t words, std::uint64_t seed);

// Appends a plan's prompt: its group's prefix words and a space (with a prefix), then its own words.
void append_plan_prompt(std::string& out, const request_plan& plan);

// The JSON body of one request: completions (`prompt`, `max_tokens`) or, when the endpoint is a chat
// one, chat (`messages`, `max_completion_tokens`); plus stream, stream_options and ignore_eos.
std::string request_body(const request_shape& shape, std::string_view model, const request_plan& plan);

// The generated text a response event or a whole JSON response carries, appended to `out`: the first
// choice's `text` (completions), `delta.content` (chat stream) or `message.content` (chat). Anything else
// (role event, usage, [DONE], not JSON) appends nothing.
void append_answer_text(std::string_view json, std::string& out);

// Whitespace-separated words of a text: the mock engine's token count for it.
std::size_t count_words(std::string_view text);

// One multi-turn chat session's messages so far, and the body of its next turn.
class conversation {
 public:
  // A new user message: the plan's prompt. The group prefix (if any) starts the session's first user
  // message only, as a shared system prompt or document would; later turns send only their own words.
  void add_user_turn(const request_plan& plan);
  // The assistant's answer to the last user message, as received.
  void add_answer(std::string text);

  // The words of every message so far: the prompt tokens the mock engine counts for the next request.
  std::size_t words() const { return words_; }
  std::size_t messages() const { return messages_.size(); }

  // A chat request with every message so far (user and assistant alternating), asking for max_tokens.
  std::string request_body(const request_shape& shape, std::string_view model, std::size_t max_tokens) const;

 private:
  struct message {
    bool from_user = true;
    std::string content;  // plain text; escaped when the body is built
  };
  std::vector<message> messages_;
  std::size_t words_ = 0;
};

// True when the endpoint takes chat messages rather than a prompt.
bool is_chat_endpoint(std::string_view endpoint);

}  // namespace dplb::loadgen
