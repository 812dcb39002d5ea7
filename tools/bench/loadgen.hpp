#pragma once
// dplb's load generator: fires OpenAI completions/chat requests at an HTTP/1.1 server the way
// `vllm bench serve` does (random-word prompts, burst or Poisson arrivals, an optional concurrency cap),
// records what each request saw (status, TTFT, inter-token gaps, usage, the DP rank from `x-dplb-rank`)
// and summarises a run in vllm's terms. Used by `dplb-bench` and by the integration tests.
//
// Threading contract: run() blocks its caller. It runs `threads` event loops (the caller's thread is one
// of them), each with its own connections; it returns when every request has finished or failed, and
// never later than about `timeout` after it started. Everything else here is plain computation.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

namespace dplb::loadgen {

// What every request of a run looks like.
struct request_shape {
  std::string endpoint = "/v1/completions";  // or "/v1/chat/completions" (the body follows the path)
  bool stream = true;                        // SSE streaming (`"stream":true`)
  bool include_usage = true;                 // `stream_options.include_usage` (streaming only)
  std::size_t input_len = 1024;              // prompt words (the mock engine counts one token per word)
  std::size_t output_len = 128;              // `max_tokens` / `max_completion_tokens`
  double range_ratio = 0.0;                  // both lengths vary uniformly by +-ratio, in [0, 1)
  // A second request class for a mixed workload: each request belongs to it with probability long_share
  // (drawn from the seed), and then asks for these lengths instead (0: the ones above). The range ratio
  // applies to both classes.
  double long_share = 0.0;                   // in [0, 1]; 0: one class
  std::size_t long_input_len = 0;
  std::size_t long_output_len = 0;
  // Shared prefixes (llm-d's "prefix groups" workload): with prefix_groups > 0 each request belongs to one
  // of that many groups, drawn uniformly from the seed, and its prompt (a chat's first user message) is
  // the group's prefix_len words, the same for every request of the group (a function of the seed and the
  // group only), then a space and the request's own input_len words. 0: no prefix.
  std::size_t prefix_groups = 0;
  std::size_t prefix_len = 0;
  bool ignore_eos = true;                    // `"ignore_eos":true`, so the engine emits exactly output_len
  std::string model;                         // empty: GET /v1/models first and use the first id
  std::vector<std::pair<std::string, std::string>> extra_headers;  // sent with every request
};

// Multi-turn chat: `sessions` conversations of `turns` requests each. Turn k of a session sends every
// earlier user message and the assistant's answer to it (the text as received), then a new user message;
// it starts only when turn k - 1 has completed, so a session has at most one request in flight. The
// sessions start at the arrival times (one per session) and hold a --max-concurrency slot from their first
// turn to their last. Request i of the run is turn i % turns of session i / turns.
struct session_options {
  std::size_t sessions = 0;  // 0: no sessions, every request on its own
  std::size_t turns = 1;
  std::string header;        // non-empty: every request of a session carries `<header>: session-<index>`

  bool enabled() const { return sessions != 0; }
};

struct run_options {
  std::string host = "127.0.0.1";  // IP literal or a name resolved once at start
  std::uint16_t port = 8000;
  std::size_t num_prompts = 1000;
  // Requests per second; infinity sends every request at t=0 (a burst, one connection each).
  double request_rate = std::numeric_limits<double>::infinity();
  // With an infinite rate only: request k of N starts at k * burst_spread / N instead of at 0, evenly
  // paced, as a client that spends a fixed time on each request delivers a burst (vllm bench serve's
  // Python client takes hundreds of milliseconds for a few hundred). Zero: all at once.
  std::chrono::duration<double> burst_spread{0};
  double burstiness = 1.0;          // gamma shape of the inter-arrival times; 1 = Poisson
  std::size_t max_concurrency = 0;  // requests in flight at most; 0 = unlimited
  std::uint64_t seed = 0;           // prompts, lengths and arrival times are a function of it
  bool keep_alive = true;           // reuse connections between requests (false: `Connection: close`)
  std::chrono::milliseconds timeout{600000};  // the whole run; requests still open then fail
  unsigned threads = 1;                       // event loops; requests are spread round-robin
  request_shape shape;
  session_options chat_sessions;  // needs a chat endpoint and num_prompts == sessions * turns
  // Called from one of run()'s threads, never concurrently, about ten times a second while requests
  // finish, and once more at the end with done == total. May be empty.
  std::function<void(std::size_t done, std::size_t total)> progress;
};

// One request as the client saw it. Times are seconds; a failed request keeps what it measured.
struct request_result {
  bool ok = false;         // status 200 and a complete response (`data: [DONE]` and the final chunk)
  unsigned status = 0;     // HTTP status; 0 when no response head arrived
  int rank = -1;           // the `x-dplb-rank` response header; -1 when absent
  double ttft_s = 0;       // first event with non-empty `choices` (non-streaming: the whole response)
  double e2e_s = 0;        // send start to the end of the response (or to the failure)
  std::vector<double> itl_s;  // gaps between consecutive content events
  std::uint64_t prompt_tokens = 0;      // from the usage chunk / usage object
  std::uint64_t completion_tokens = 0;  // idem
  bool has_usage = false;               // a usage object was seen
  std::size_t events = 0;               // content events (non-empty `choices`)
  std::size_t input_words = 0;          // words in the prompt sent (a chat's: over all its messages)
  int prefix_group = -1;                // its prefix group (a session turn: its session's); -1: none
  std::string answer;                   // the generated text, kept only for multi-turn sessions
  std::size_t max_tokens = 0;           // output length asked for
  std::string error;                    // empty when ok
  std::chrono::steady_clock::time_point start{};  // when the request was handed to a connection
};

struct run_report {
  std::vector<request_result> results;  // in request order (index i carries x-request-id "<run>-i")
  double duration_s = 0;                // first dispatch to last completion
  std::string model;                    // the model the requests named
  std::string error;                    // a set-up failure (bad options, name resolution, /v1/models)

  std::size_t succeeded() const;
  std::size_t failed() const;
  // Requests per `x-dplb-rank` value, counting every request that got a response head; ranks from 0 to
  // the highest seen are all present (a rank that got nothing shows 0); -1 counts responses without it.
  std::map<int, std::size_t> rank_counts() const;
};

// Checks the options; an empty string when run() would accept them, else one line saying what is wrong.
std::string validate(const run_options& options);

// Runs the benchmark. Never throws for network trouble: failures are recorded per request, and a set-up
// failure fills report.error and marks every request failed with it.
run_report run(const run_options& options);

// Raises RLIMIT_NOFILE's soft limit to the hard limit (every concurrent request holds a descriptor).
// Returns the soft limit in force afterwards.
std::uint64_t raise_open_file_limit();

struct latency_stats {  // milliseconds
  double mean_ms = 0;
  double median_ms = 0;
  double p99_ms = 0;
  std::size_t samples = 0;
};

// A run in vllm bench serve's terms (successful requests only, unless said otherwise).
struct summary {
  std::size_t completed = 0;
  std::size_t failed = 0;
  double duration_s = 0;
  std::uint64_t total_input_tokens = 0;   // usage prompt_tokens (words sent when no usage came)
  std::uint64_t total_output_tokens = 0;  // usage completion_tokens (content events when no usage came)
  double request_throughput = 0;          // completed / duration
  double output_throughput = 0;           // output tokens / duration
  double total_token_throughput = 0;      // (input + output tokens) / duration
  double peak_output_throughput = 0;      // most content events in one 1 s bucket (as vllm does)
  std::size_t peak_concurrency = 0;       // most requests in flight at one instant
  latency_stats ttft, tpot, itl, e2el;
  std::map<int, std::size_t> per_rank;  // run_report::rank_counts()
  std::size_t rank_spread = 0;          // max - min over ranks >= 0
  std::map<std::string, std::size_t> errors;  // failure message -> count
};

summary summarize(const run_report& report);
// The "Serving Benchmark Result" block, then the per-rank section (and failures, if any).
std::string format_summary(const summary& s);
// vllm's result-json keys (completed, duration, mean_ttft_ms, ...) plus per_rank and rank_max_min.
nlohmann::json to_json(const summary& s, const run_report& report);

}  // namespace dplb::loadgen
