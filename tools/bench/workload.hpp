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
  std::size_t input_words = 0;  // prompt length in words
  std::size_t max_tokens = 0;   // output length asked for
  std::uint64_t prompt_seed = 0;
};

// Lengths drawn uniformly from [len * (1 - ratio), len * (1 + ratio)] (floor, ceil; at least 1), as
// vllm's random dataset does; len is the long class's for the requests drawn into it (shape.long_share).
// Which requests are long comes from a stream of its own: every request keeps the prompt seed it has
// without a long class, and with a range ratio of 0 the others keep their lengths too.
std::vector<request_plan> plan_requests(const request_shape& shape, std::size_t count, std::uint64_t seed);

// Seconds after the start at which each request is due. For an infinite rate, request k at
// k * spread_s / count (all 0 without a spread); otherwise the first at 0 and gamma-distributed gaps
// (shape = burstiness, mean = 1 / rate) after it, and spread_s must be 0.
std::vector<double> arrival_offsets(std::size_t count, double rate, double burstiness, std::uint64_t seed,
                                    double spread_s = 0.0);

// Appends `words` space-separated lowercase words (no characters JSON must escape).
void append_prompt(std::string& out, std::size_t words, std::uint64_t seed);

// The JSON body of one request: completions (`prompt`, `max_tokens`) or, when the endpoint is a chat
// one, chat (`messages`, `max_completion_tokens`); plus stream, stream_options and ignore_eos.
std::string request_body(const request_shape& shape, std::string_view model, const request_plan& plan);

// True when the endpoint takes chat messages rather than a prompt.
bool is_chat_endpoint(std::string_view endpoint);

}  // namespace dplb::loadgen
