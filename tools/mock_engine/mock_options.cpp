#include "mock_options.hpp"

#include <algorithm>
#include <boost/program_options.hpp>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <limits>
#include <ostream>
#include <stdexcept>
#include <vector>

namespace dplb::mock {
namespace {

namespace po = boost::program_options;

// Everything about the mock that the option list alone does not say; the tests and the demo depend on it.
constexpr const char* help_epilogue = R"(
Start-up: once every rank and the admin port listen, stdout gets one line per rank (with --dp N > 1
each followed by a line saying so), the admin line, then a last line:
  mock-engine rank <i> listening on <host>:<port>
  mock-engine rank <i> serves <N> DP engines
  mock-engine rank <i> engine <j> kv-events tcp://<host>:<port>[ kv-replay tcp://<host>:<port>]
  mock-engine admin listening on <host>:<admin-port>
  mock-engine ready
SIGTERM or SIGINT closes everything and exits 0. Every response carries `x-mock-rank: <i>`; those
answered by an engine (completions, chat, /mock/echo, /mock/stream) also `x-mock-engine: <j>`, the
engine's index on its port.

DP engines (--ranks K --dp N): K ports, rank i on port+i, each serving N DP engines (vLLM's internal
LB, `vllm serve --data-parallel-size N` behind one URL); each engine is a full engine of its own
(metrics, and with --simulate its own scheduler; --dp-lockstep steps all K*N together).
  X-data-parallel-rank: j (any case) on completions/chat sends the request to engine j of the port.
  With --dp N > 1 an integer outside [0, N) gets 400 {"error":{"message":..,"type":"BadRequestError",
  "param":null,"code":400}} before any work (a plain answer, even for stream=true). With --dp 1
  (vLLM's external LB) the port accepts 0 or its own global rank i; any other integer gets the 400.
  A value that is not an integer is ignored, as vLLM does. Without a usable header the port picks
  by --dp-balance. least-inflight (the default): the engine with the fewest completions/chat in
  flight (read, not yet answered), the lowest index on a tie: back-to-back requests on an idle port
  all go to engine 0. oracle (benchmarks of prefix-aware routing: the ceiling a router that knew the
  engines' caches exactly could reach): with T requests in flight over the port's N engines, engine
  e is a candidate if in_flight(e) + 1 <= ceil(C * (T + 1) / N), C = --load-bound; the candidate whose
  KV cache holds the most leading blocks of the prompt's block-hash chain (as the scheduler will
  look them up at admission) takes it, ties to the fewest in flight, then the lowest index; if no
  candidate holds a block, the least-inflight choice. The body is then parsed before routing (its
  errors are still answered after the faults, as always). /mock/echo and /mock/stream are routed as
  by least-inflight (an out-of-range value is ignored there).

Endpoints (per rank):
  POST /v1/completions, /v1/chat/completions   vLLM/OpenAI formats, streaming (SSE, one event per
      HTTP chunk) or not. Tokens are " tok"; every request generates exactly max_tokens tokens
      (chat: max_completion_tokens, else max_tokens, else --default-max-tokens), finish_reason
      "length". prompt_tokens = number of whitespace-separated words in `prompt` (a string, or the
      sum over an array of strings; a token-id array counts its ids) or, for chat, in every message's
      content (text parts summed). x-request-id becomes the id (cmpl-<id> / chatcmpl-<id>).
      Streaming: headers at once, first token after --ttft-ms, then one every --itl-ms; usage event
      with stream_options.include_usage; then `data: [DONE]`. Non-streaming: one JSON answer after
      ttft + (max_tokens - 1) * itl. Closing the connection aborts the request.
  POST /tokenize   vLLM's: {"model":M,"prompt":..} or {"model":M,"messages":[..]} -> {"count":N,
      "max_model_len":8192,"tokens":[..],"token_strs":null}: exactly the ids completions (prompt) or
      chat (messages) prefill. Token ids are 32-bit: ids given must be in [0, 2^32) (else 400), a
      word's id is its hash reduced below 2^31.
  GET /v1/models, /version, /health (200, empty), GET|POST /ping, GET /metrics (Prometheus text:
      vllm:num_requests_running/_waiting, vllm:kv_cache_usage_perc, vllm:prompt_tokens_total,
      vllm:generation_tokens_total, vllm:request_success_total, vllm:prefix_cache_queries_total,
      vllm:prefix_cache_hits_total, vllm:num_preemptions_total and the mock_* counters:
      mock_requests_received_total, _aborted_total, _dropped_total, _reset_total,
      mock_health_checks_total, mock_metrics_scrapes_total, mock_connections_accepted_total, mock_connections_open,
      mock_connections_closed_by_fault_total, mock_requests_routed_total,
      mock_requests_routed_by_header_total). With --dp 1 every series has the label engine="<i>", i
      the rank. With --dp N > 1 the vLLM series, mock_requests_aborted_total and _routed_* (and the
      simulation's) appear once per engine, engine="<j>" (j = 0..N-1, the engine's index on the port,
      as vLLM's internal LB labels them); the port's own mock_* series (received, dropped, reset,
      health checks, scrapes, connections) have no label. vllm:kv_cache_usage_perc and the prefix
      cache and preemption counters follow the simulated KV cache with --simulate (see below); 0
      without.
  /mock/echo       (any method) JSON: method, target, headers (in received order), body_size,
                   body_fnv1a64 (FNV-1a 64, 16 hex digits), chunked (request body was chunked),
                   engine (the engine that answered), x_data_parallel_rank (the header's value, or
                   null).
  /mock/echo-body  (any method) the request body back, application/octet-stream.
  /mock/stream?events=N&interval_ms=M&bytes=B   N SSE events (default 10, 0 ms, 0 bytes), one per
                   chunk every M ms: data: {"i":<0..N-1>,"t_us":<CLOCK_MONOTONIC us at write>,
                   "pad":"x..."} padded to about B bytes, then data: [DONE].
  Anything else: 404 {"detail":"Not Found"}.
Limits: request head 64 KiB (431), request body 64 MiB (413); each body read and write: 60 s.

Prefill/decode roles (--kv-role; vLLM's NixlConnector seen from HTTP):
  prefill: a completions/chat request with "kv_transfer_params":{"do_remote_decode":true,..} and
      stream false is answered as usual plus a top-level "kv_transfer_params":{"do_remote_prefill":true,
      "do_remote_decode":false,"remote_block_ids":[..],"remote_engine_id":"mock-<pid>-<e>",
      "remote_request_id":"<x-request-id or prefill>-kv<n>","remote_host":H,"remote_port":P,"tp_size":1}
      (H:P the rank that served it; one synthetic block per 16 prompt tokens, per --block-size with
      --simulate). The blocks are held until pulled once or --kv-hold-timeout-ms passes; an answer that
      cannot be written frees them. With --simulate the request pays its prompt's simulated prefill.
  decode: a request with "kv_transfer_params":{"do_remote_prefill":true,..} (the prefill answer's
      object) first pulls the blocks with POST http://H:P/internal/kv-pull, waits
      --kv-transfer-us-per-block per block, then generates as usual; a failed pull answers 400
      {"error":{"message":"KV transfer of request .. failed: ..","type":"BadRequestError",..}}.
      With --simulate the wait is simulated time and the request then joins the decode batch without
      its prefill (its first step computes the last prompt token only). A decode request that ends
      before its pull (a fault's status or stall, a refusal) frees the prefill's hold at once.
  Requests without kv_transfer_params are served whole in both roles. Every rank of a prefill or
  decode mock answers POST /internal/kv-pull {"remote_engine_id":..,"remote_request_id":..} with
  200 {"blocks":N,"prompt_tokens":M} (freeing the hold) or 404 NotFoundError. /metrics adds
  mock_kv_transfers_total, mock_kv_transfer_errors_total (decode), mock_kv_blocks_held,
  mock_kv_holds_expired_total (prefill).

Simulated serving (--simulate; off by default, and then none of this applies):
  Each rank runs a continuous-batching engine shaped after vLLM's V1 scheduler instead of pacing each
  request on its own timer (--ttft-ms and --itl-ms must then be 0). Requests queue; each step, every
  running request is scheduled (a decode takes 1 token of the --max-num-batched-tokens budget, an
  unfinished prompt its next chunk), then queued requests are admitted in arrival order while fewer
  than --max-num-seqs run and budget is left. A request produces its first token at the end of the
  step that completes its prefill, then one token at the end of every step, exactly max_tokens in all
  (ignore_eos); each token goes out as its SSE event at the end of its step (a client that reads
  slowly gets several events in one write). Non-streaming answers are sent after the last token.
  A step lasts
      step_base + step_per_token * padded(batch) + prefill_per_token * prompt tokens prefilled
  where batch = requests scheduled in the step and padded(n) = the smallest CUDA-graph capture size
  >= n (n itself above the largest: no graph). Without --dp-lockstep a rank steps on its own clock,
  only while it has work. With --dp-lockstep all ranks of the process step together, as MoE DP ranks
  do: a step runs while any rank has work, idle ranks run a dummy batch (counted as 1), every rank
  pads to the largest padded batch, and the longest prefill sets the rest of the step.
  The KV cache (vLLM V1's, one attention type): --kv-blocks blocks of --block-size tokens per engine.
  A request holds blocks for the tokens it computed; it is admitted only when blocks for its first
  chunk are free (else the queue waits, in order), and a running request that needs a block when none
  is free preempts the last admitted one (recompute: it frees its blocks, goes back to the front of the
  queue and prefills its prompt and the tokens it produced again). A request longer than the whole
  cache (prompt + max_tokens) gets 400, as vLLM refuses a context above its max_model_len. Prefix
  caching (on unless --no-enable-prefix-caching): a full block (prompt or output: every generated
  token is the word "tok") is named, when scheduled, by a hash chained over the blocks before it; a
  later prompt that starts with the same chain reuses those blocks
  and prefills only the rest (the last prompt token always, as vLLM). Tokens: the ids a prompt gives,
  else one per whitespace-separated word (hashed), through the prompt's parts or the messages'
  contents in order. Free blocks stay cached until reused, least recently freed first (a request's
  last block first). /metrics: vllm:prefix_cache_queries_total and _hits_total (tokens: at each
  admission, those to compute and those found cached), vllm:num_preemptions_total,
  vllm:cache_config_info, vllm:kv_cache_usage_perc = blocks held / --kv-blocks (cached free blocks
  count as free), mock_kv_tokens (tokens whose KV the running requests hold).
  Not simulated: speculative decoding, stop strings (ignore_eos always), the DP wave start latency.
  Defaults model a large MoE (DeepSeek-V3 class) served with DP attention + expert parallelism, one
  H100/H200-class GPU per rank: a step costs a fixed 15 ms (the rank's share of the weights read,
  the all-to-alls of every MoE layer, launches: independent of the batch) plus 0.15 ms per padded
  sequence (attention over its KV cache, its share of the expert GEMMs): 24.6 ms at batch 64, about
  2.6k output tokens/s per rank, the order of published DeepSeek-V3/R1 decode figures per GPU.
  Prefill at 20 us per prompt token (50k tokens/s per rank) is faster than such a model really
  prefills (published: ~100-150 us per token per GPU), on purpose: the decode-phase effects that a
  balancer acts on stay visible instead of drowning in prefill; --prefill-us-per-token 120 gives a
  prefill-heavy picture. --max-num-batched-tokens 8192 is vLLM's API-server default on 80 GB GPUs;
  --max-num-seqs 256 (vLLM uses 1024 on H100/H200; either way the graphs go up to 512).
  Time: every simulated duration is divided by --time-scale X. /metrics (running, waiting, steps,
  padded tokens) follows the simulation, but every latency a client measures is wall time: multiply
  benchmark latencies (TTFT, TPOT, ITL, duration) by X, and divide throughputs by X, to read them as
  the simulated engine's. That holds while the mock keeps up with X: the mean delay of a step's end,
  mock_step_lag_seconds_total / mock_steps_total (wall), must stay small against the mean step's wall
  time, mock_step_seconds_total / X / mock_steps_total; else lower X. The simulated clock never
  drifts (a late step delays its tokens, not the next step): mock_step_seconds_total is the exact
  simulated busy time, e.g. a burst's makespan on an otherwise idle lockstep engine.
  Metrics with --simulate: vllm:num_requests_running (admitted: prefilling or decoding) and
  vllm:num_requests_waiting (queued) come from the scheduler, updated when a step begins or ends (as
  vLLM's per-step scheduler stats: a request arriving mid-step shows at the step's end), and per rank:
    mock_steps_total           steps run (an idle rank's dummy steps under --dp-lockstep included)
    mock_padded_tokens_total   sum over steps of the padded batch the rank ran
    mock_even_padded_tokens_total  the same had each step's sequences of the lockstep group been
                               split evenly over its ranks: the floor any placement can reach
    mock_real_tokens_total     sum over steps of the requests it scheduled; padding waste =
                               1 - real / padded
    mock_step_seconds_total    simulated seconds spent in steps
    mock_step_lag_seconds_total  wall seconds the event loop handled step ends late, summed
    mock_prompt_tokens_pending   gauge: prompt tokens of waiting and running requests not yet prefilled
    mock_decode_tokens_pending   gauge: tokens they have still to produce

KV-cache events (--simulate --kv-events-port P; vLLM's ZmqEventPublisher): engine e (engine j of rank
  i, e = i * dp + j) binds a PUB socket on tcp://host:P+e and, with --kv-replay-port R, a ROUTER on
  R+e. Messages: [topic, seq (8 bytes big-endian, 0, 1, ... per engine), msgpack EventBatch] with
  EventBatch [ts, events, data_parallel_rank=j] (array) or {"ts","events","data_parallel_rank"} (map),
  one per engine step that changed the cache, sent at the step's end. BlockStored: each run of a
  request's newly cached blocks (prompt or output) with its parent hash (nil: the prompt's first
  block), block_size token ids per block, medium "GPU", lora nil, extra_keys [["salt"], nil, ..] only
  with a cache_salt. BlockRemoved: names lost to eviction, before the stores that reuse the blocks.
  AllBlocksCleared: a reset. Replay: send the 8-byte start seq (DEALER, or REQ's envelope); the
  answer is every kept batch with seq >= start, then seq -1 with an empty payload. A batch that finds
  the publisher's queue full is dropped, its seq skipped (mock_kv_event_batches_dropped_total).

Fault injection, on the admin port (always up, whatever the faults; answers JSON):
  GET    /fault?rank=<i>        the rank's fault state
  POST   /fault?rank=<i>        body: a JSON object of the fields below to set (absent: unchanged; {}
                                changes nothing); answers the new state
  DELETE /fault?rank=<i>        back to normal (also POST /fault/clear?rank=<i>); answers the state
  GET    /metrics?rank=<i>      the rank's /metrics text (reachable while the rank is faulted)
  POST   /metrics/override?rank=<i>&engine=<j>   body {"running":5,"waiting":7,"kv_cache_usage":0.9}
                                (any subset; null = back to the real value): engine j of rank i
                                reports these gauges until cleared; answers the engine's overrides
                                (GET: the same without changing them). engine= is required (0 with --dp 1)
  DELETE /metrics/override      clears every override of every engine
  POST   /metrics/raw?rank=<i>  the rank's /metrics (and GET /metrics?rank=<i>) answers exactly the
                                request body from now on (garbage, NaN, missing series...)
  DELETE /metrics/raw?rank=<i>  back to the real text
  POST   /kv-events/publish?rank=<i>&engine=<j>[&seq=<S>]   the body, raw, is the payload of engine j's
                                next KV-events message (sent as seq S, numbering on from S+1)
  POST   /kv-events/reset?rank=<i>[&engine=<j>]   resets the prefix cache(s), publishing AllBlocksCleared
  GET    /stats                 {"ports":[{"rank":i,"port":P,"engines":[{"engine":j,"requests_routed":n,
                                "requests_routed_by_header":h,"requests_in_flight":f},..],"recent":[{"engine":j,
                                "x_data_parallel_rank":"<value>"|null},..]},..]}: completions/chat per engine, and
                                the port's last 1024 of them, oldest first ("engine":null: refused, 400)
  Bad rank, unknown field or bad value: 400 {"error":{"message":..,"type":"BadRequestError",..}}.
  Fields (default = normal behaviour):
    health_status N       GET /health answers N (200..599), empty body. Default 200.
    status N              completions/chat answer N (400..599) at once with vLLM's error JSON, e.g.
                          500 {"error":{"message":..,"type":"InternalServerError","param":null,
                          "code":500}}. 0 = off (default).
    reset_on_request b    completions/chat: the connection is reset (RST) as soon as the request
                          head is read; no response byte. Default false.
    reset_after_events N  streaming completions/chat: min(N, max_tokens) token events (each its own
                          chunk; chat's role event not counted), then RST instead of the usage
                          event, [DONE] and the last chunk. 0 = off (default). Read at stream start.
    stall_ms T            completions/chat: wait T ms after reading the request, before any
                          response byte, then answer normally; a client leaving meanwhile aborts.
    listening b           false: the rank's port refuses connections and its open connections are
                          closed (FIN) at once; true: listening again on the same port. The answer
                          comes once this is done. Default true.
    accept_but_ignore b   connections are accepted but never answered (a new one is not read; a
                          kept-alive one goes silent at its next request) until the client closes
                          them. Clearing it affects the next connections. Default false.
  Counting: a reset request counts in mock_requests_received_total and mock_requests_reset_total
  only (neither success nor abort); a request cut by "listening": false counts neither as success
  nor as abort; an ignored connection counts no request.
  Example: curl -s -X POST 'http://127.0.0.1:<admin-port>/fault?rank=0' -d '{"status":503}'
)";

// "1,2,4,8": capture sizes, each in [1, 65536]; sorted and deduplicated.
std::vector<std::uint32_t> parse_sizes(const std::string& text) {
  std::vector<std::uint32_t> sizes;
  std::size_t at = 0;
  while (at <= text.size()) {
    const auto comma = std::min(text.find(',', at), text.size());
    const auto item = text.substr(at, comma - at);
    std::uint32_t size = 0;
    const auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), size);
    if (item.empty() || ec != std::errc{} || end != item.data() + item.size() || size < 1 || size > 65536) {
      throw std::invalid_argument(
          "--cudagraph-sizes must be a comma-separated list of integers in [1, 65536], got '" + text + "'");
    }
    sizes.push_back(size);
    at = comma + 1;
  }
  std::sort(sizes.begin(), sizes.end());
  sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
  return sizes;
}

// Microseconds (fractions allowed) in [0, 60 s], as nanoseconds.
std::chrono::nanoseconds microseconds_option(const po::variables_map& vm, const char* name) {
  const auto value = vm[name].as<double>();
  if (!(value >= 0 && value <= 60e6)) {
    throw std::invalid_argument("--" + std::string(name) + " must be in [0, 60000000] microseconds");
  }
  return std::chrono::nanoseconds(std::llround(value * 1000));
}

double as_us(std::chrono::nanoseconds d) { return static_cast<double>(d.count()) / 1000; }

// A default's text on --help: "15000", or "0.5" for a fraction.
std::string us_text(std::chrono::nanoseconds d) {
  if (d.count() % 1000 == 0) return std::to_string(d.count() / 1000);
  std::string text = std::to_string(as_us(d));
  text.erase(text.find_last_not_of('0') + 1);
  return text;
}

// Reads an integer option and checks its range; signed reading so that "-1" is refused, not wrapped.
std::int64_t bounded(const po::variables_map& vm, const char* name, std::int64_t min, std::int64_t max) {
  const auto value = vm[name].as<std::int64_t>();
  if (value < min || value > max) {
    throw std::invalid_argument("--" + std::string(name) + " must be in [" + std::to_string(min) + ", " +
                                std::to_string(max) + "], got " + std::to_string(value));
  }
  return value;
}

// --dp-balance and --load-bound, and what the oracle needs of the rest (but prefix caching, read with
// the simulation's flags).
void read_balance(const po::variables_map& vm, mock_options& options) {
  const auto mode = vm["dp-balance"].as<std::string>();
  if (mode == "least-inflight") {
    options.balance = dp_balance::least_inflight;
  } else if (mode == "oracle") {
    options.balance = dp_balance::oracle;
  } else {
    throw std::invalid_argument("--dp-balance must be least-inflight or oracle, got '" + mode + "'");
  }
  if (!vm["load-bound"].defaulted() && options.balance != dp_balance::oracle) {
    throw std::invalid_argument("--load-bound needs --dp-balance oracle");
  }
  options.load_bound = vm["load-bound"].as<double>();
  if (!(options.load_bound >= 1 && options.load_bound <= 1e6)) {
    throw std::invalid_argument("--load-bound must be in [1, 1000000]");
  }
  if (options.balance != dp_balance::oracle) return;
  if (!vm["simulate"].as<bool>()) {
    throw std::invalid_argument("--dp-balance oracle needs --simulate (it reads the simulated KV caches)");
  }
  if (options.dp < 2) throw std::invalid_argument("--dp-balance oracle needs --dp > 1 (it picks among a port's engines)");
  if (options.threads != 1) {
    // The caches live on thread 0's event loop; with one thread every session runs there too and reads
    // them directly, and chooses and claims its engine in one go (see session.cpp).
    throw std::invalid_argument("--dp-balance oracle needs --threads 1 (the simulated KV caches live on thread 0)");
  }
}

// The KV-cache events' flags. Called with --simulate only (each flag needs it).
void read_kv_events(const po::variables_map& vm, mock_options& options) {
  const unsigned engines = options.ranks * options.dp;
  // Each needs a port range of one port per engine, all within 1..65535 (0 would be an ephemeral port,
  // which dplb could not be told in advance).
  const auto port_range = [&](const char* name) {
    const auto port = static_cast<std::uint16_t>(bounded(vm, name, 1, 65535));
    if (port + engines - 1 > 65535) {
      throw std::invalid_argument("--" + std::string(name) + " + engines - 1 (" + std::to_string(engines) +
                                  " engines: --ranks * --dp) must not exceed 65535");
    }
    return port;
  };
  if (vm.count("kv-events-port") == 0) {
    for (const char* name : {"kv-replay-port", "kv-events-topic", "kv-events-encoding", "kv-events-int-hashes",
                             "kv-buffer-steps"}) {
      if (vm.count(name) != 0 && !vm[name].defaulted())
        throw std::invalid_argument("--" + std::string(name) + " needs --kv-events-port");
    }
    return;
  }
  options.kv_events_port = port_range("kv-events-port");
  if (vm.count("kv-replay-port") != 0) {
    options.kv_replay_port = port_range("kv-replay-port");
    const unsigned a = options.kv_events_port;
    const unsigned b = options.kv_replay_port;
    if (a < b + engines && b < a + engines) {
      throw std::invalid_argument("the ports of --kv-events-port and --kv-replay-port overlap (one per engine each)");
    }
  }
  options.kv_events_topic = vm["kv-events-topic"].as<std::string>();
  const auto encoding = vm["kv-events-encoding"].as<std::string>();
  if (encoding == "map") {
    options.kv_events_encoding = kv_event_encoding::map;
  } else if (encoding == "array") {
    options.kv_events_encoding = kv_event_encoding::array;
  } else {
    throw std::invalid_argument("--kv-events-encoding must be array or map, got '" + encoding + "'");
  }
  options.kv_events_int_hashes = vm["kv-events-int-hashes"].as<bool>();
  options.kv_buffer_steps = static_cast<std::uint64_t>(bounded(vm, "kv-buffer-steps", 0, 1'000'000));
  options.engine.kv.record_events = true;
}

// --kv-role and the flags of its roles.
void read_kv_role(const po::variables_map& vm, mock_options& options) {
  const auto role = vm["kv-role"].as<std::string>();
  if (role == "both") {
    options.role = kv_role::both;
  } else if (role == "prefill") {
    options.role = kv_role::prefill;
  } else if (role == "decode") {
    options.role = kv_role::decode;
  } else {
    throw std::invalid_argument("--kv-role must be prefill, decode or both, got '" + role + "'");
  }
  options.kv_hold_timeout = std::chrono::milliseconds(bounded(vm, "kv-hold-timeout-ms", 1, 86'400'000));
  options.kv_transfer_per_block = microseconds_option(vm, "kv-transfer-us-per-block");
  if (!vm["kv-hold-timeout-ms"].defaulted() && options.role != kv_role::prefill) {
    throw std::invalid_argument("--kv-hold-timeout-ms needs --kv-role prefill");
  }
  if (!vm["kv-transfer-us-per-block"].defaulted() && options.role != kv_role::decode) {
    throw std::invalid_argument("--kv-transfer-us-per-block needs --kv-role decode");
  }
}

}  // namespace

command_line_result parse_command_line(int argc, const char* const* argv, std::ostream& out,
                                       std::ostream& err) {
  // A day: no sane generation waits longer, and adding it to a steady_clock time point cannot overflow.
  constexpr std::int64_t max_ms = 86'400'000;
  const mock_options defaults;
  po::options_description described(
      "dplb-mock-engine: a fake vLLM engine serving one or more DP ranks\n\nOptions");
  // clang-format off
  described.add_options()
    ("help,h", "print this help and exit")
    ("host", po::value<std::string>()->value_name("ADDR")->default_value(defaults.host), "address every rank listens on")
    ("port", po::value<std::int64_t>()->value_name("PORT")->default_value(defaults.port),
     "rank i listens on port+i; 0 = an ephemeral port per rank")
    ("ranks", po::value<std::int64_t>()->value_name("K")->default_value(defaults.ranks),
     "number of ports (DP ranks, vLLM's external LB: one server per rank)")
    ("dp", po::value<std::int64_t>()->value_name("N")->default_value(defaults.dp),
     "DP engines behind each port (vLLM's internal LB: --data-parallel-size N behind one URL); "
     "X-data-parallel-rank: j picks engine j, else the port balances by --dp-balance (see below)")
    ("dp-balance", po::value<std::string>()->value_name("MODE")->default_value("least-inflight"),
     "how a port with --dp N > 1 picks the engine of a request without X-data-parallel-rank: "
     "least-inflight (the fewest completions/chat in flight, the lowest index on a tie) or oracle (the "
     "engine whose simulated KV cache holds the longest prefix of the prompt, within --load-bound; needs "
     "--simulate, --dp > 1, --threads 1 and prefix caching)")
    ("load-bound", po::value<double>()->value_name("C")->default_value(defaults.load_bound, "1.25"),
     "--dp-balance oracle: an engine is a candidate only if its requests in flight + 1 <= "
     "ceil(C * (the port's requests in flight + 1) / N); C in [1, 1000000]")
    ("model", po::value<std::string>()->value_name("NAME")->default_value(defaults.model),
     "served model name (another `model` in a request gets vLLM's 404)")
    ("ttft-ms", po::value<std::int64_t>()->value_name("MS")->default_value(defaults.ttft.count()),
     "time to first token, milliseconds")
    ("itl-ms", po::value<std::int64_t>()->value_name("MS")->default_value(defaults.itl.count()),
     "inter-token latency, milliseconds")
    ("default-max-tokens", po::value<std::int64_t>()->value_name("N")->default_value(
       static_cast<std::int64_t>(defaults.default_max_tokens)),
     "tokens generated when a request sets no max_tokens")
    ("keepalive-timeout-ms", po::value<std::int64_t>()->value_name("MS")->default_value(defaults.keepalive_timeout.count()),
     "idle keep-alive connections are closed silently after this (uvicorn/vLLM: 5000)")
    ("close-on-request", po::value<std::int64_t>()->value_name("N")->default_value(0),
     "N: read the head of the N-th request of each connection, then close without answering "
     "(N >= 2 simulates the keep-alive race); 0 = off")
    ("threads", po::value<std::int64_t>()->value_name("N")->default_value(defaults.threads),
     "event-loop threads (each its own io_context; acceptors share ports with SO_REUSEPORT)")
    ("admin-port", po::value<std::int64_t>()->value_name("PORT")->default_value(defaults.admin_port),
     "fault-injection admin listener on host:PORT (see below); 0 = an ephemeral port");
  po::options_description simulation("Simulated serving (see below; each needs --simulate)");
  simulation.add_options()
    ("simulate", po::bool_switch(),
     "simulate a continuous-batching engine per DP engine (default off: per-request timers)")
    ("dp-lockstep", po::bool_switch(),
     "all engines of the process (every rank's --dp engines) step together, as MoE DP ranks: step time = "
     "slowest engine's padded batch, idle engines run dummy batches (default off: a clock per engine)")
    ("time-scale", po::value<double>()->value_name("X")->default_value(defaults.time_scale, "1"),
     "simulated time runs X times faster than wall time, X in [0.001, 10000]")
    ("start-after", po::value<std::int64_t>()->value_name("N")->default_value(0),
     "no step runs until N requests have arrived, over all ranks (they then start together: a burst's "
     "t=0, independent of how fast the client sent it); 0 = step at once")
    ("kv-blocks", po::value<std::int64_t>()->value_name("N")->default_value(defaults.engine.kv.num_blocks),
     "KV-cache capacity per engine, in blocks (vLLM's num_gpu_blocks): a request is admitted only when "
     "blocks for its chunk are free, and a full cache preempts (recompute); vllm:kv_cache_usage_perc = "
     "blocks held / N")
    ("block-size", po::value<std::int64_t>()->value_name("N")->default_value(defaults.engine.kv.block_size),
     "tokens per KV block, in [1, 1024]")
    ("no-enable-prefix-caching", po::bool_switch(),
     "turn prefix caching off (default on, as in vLLM: a prompt's leading blocks cached by an earlier "
     "request are not prefilled again)")
    ("max-num-seqs", po::value<std::int64_t>()->value_name("N")->default_value(defaults.engine.max_num_seqs),
     "requests running at once per engine; the rest wait")
    ("max-num-batched-tokens", po::value<std::int64_t>()->value_name("N")->default_value(
       defaults.engine.max_num_batched_tokens),
     "tokens a step may process (decodes 1 each, prompts chunked into the rest), >= --max-num-seqs; "
     "0 = no budget: a prompt is prefilled whole in its first step")
    ("step-base-us", po::value<double>()->value_name("US")->default_value(
       as_us(defaults.engine.step_base), us_text(defaults.engine.step_base)),
     "fixed cost of every step (dummy ones too), simulated microseconds")
    ("step-us-per-token", po::value<double>()->value_name("US")->default_value(
       as_us(defaults.engine.step_per_token), us_text(defaults.engine.step_per_token)),
     "cost per sequence of the padded batch, simulated microseconds")
    ("prefill-us-per-token", po::value<double>()->value_name("US")->default_value(
       as_us(defaults.engine.prefill_per_token), us_text(defaults.engine.prefill_per_token)),
     "cost per prompt token prefilled, simulated microseconds")
    ("cudagraph-sizes", po::value<std::string>()->value_name("LIST"),
     "CUDA-graph capture sizes, e.g. 1,2,4,8,16 (default: vLLM's for --max-num-seqs: 1,2,4, every 8 "
     "to 248, every 16 from 256 to min(2 * max-num-seqs, 512))");
  described.add(simulation);
  po::options_description kv_events("vLLM's KV-cache events (see below; each needs --simulate, and the others --kv-events-port)");
  kv_events.add_options()
    ("kv-events-port", po::value<std::int64_t>()->value_name("P"),
     "publish KV-cache events on ZMQ PUB sockets, engine e (engine j of rank i: e = i * dp + j) on "
     "tcp://host:P+e; default off. P + engines - 1 <= 65535 (no ephemeral ports: dplb must know them)")
    ("kv-replay-port", po::value<std::int64_t>()->value_name("R"),
     "a ZMQ ROUTER replay socket per engine on tcp://host:R+e (default: none)")
    ("kv-events-topic", po::value<std::string>()->value_name("TOPIC")->default_value(""),
     "the topic frame of every message (vLLM's default: empty)")
    ("kv-events-encoding", po::value<std::string>()->value_name("array|map")->default_value("map"),
     "EventBatch and events as msgspec arrays (vLLM < 0.26) or maps (vLLM >= 0.26)")
    ("kv-events-int-hashes", po::bool_switch(),
     "block hashes as msgpack integers (vLLM's VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES); default 32-byte bins")
    ("kv-buffer-steps", po::value<std::int64_t>()->value_name("N")->default_value(10000),
     "batches kept per engine for replay, in [0, 1000000] (vLLM's buffer_steps)");
  described.add(kv_events);
  po::options_description disaggregation("Prefill/decode disaggregation (see below)");
  disaggregation.add_options()
    ("kv-role", po::value<std::string>()->value_name("ROLE")->default_value("both"),
     "prefill, decode or both (the default: kv_transfer_params are ignored, as before)")
    ("kv-hold-timeout-ms", po::value<std::int64_t>()->value_name("MS")->default_value(defaults.kv_hold_timeout.count()),
     "prefill: blocks not pulled by a decode engine within MS are freed (vLLM's "
     "VLLM_NIXL_ABORT_REQUEST_TIMEOUT, 480 s)")
    ("kv-transfer-us-per-block", po::value<double>()->value_name("US")->default_value(
       as_us(defaults.kv_transfer_per_block), us_text(defaults.kv_transfer_per_block)),
     "decode: time a pulled block adds before the first token, microseconds (simulated with --simulate)");
  described.add(disaggregation);
  // clang-format on

  try {
    po::variables_map vm;
    po::store(po::command_line_parser(argc, argv).options(described).run(), vm);
    po::notify(vm);
    if (vm.count("help") != 0) {
      out << described << help_epilogue;
      return {std::nullopt, 0};
    }

    mock_options options;
    options.host = vm["host"].as<std::string>();
    if (options.host.empty()) throw std::invalid_argument("--host must not be empty");
    options.port = static_cast<std::uint16_t>(bounded(vm, "port", 0, 65535));
    options.ranks = static_cast<unsigned>(bounded(vm, "ranks", 1, 1024));
    if (options.port != 0 && options.port + options.ranks - 1 > 65535) {
      throw std::invalid_argument("--port + --ranks - 1 must not exceed 65535");
    }
    options.dp = static_cast<unsigned>(bounded(vm, "dp", 1, 1024));
    if (options.ranks * options.dp > 4096) throw std::invalid_argument("--ranks * --dp must not exceed 4096");
    options.model = vm["model"].as<std::string>();
    if (options.model.empty()) throw std::invalid_argument("--model must not be empty");
    options.ttft = std::chrono::milliseconds(bounded(vm, "ttft-ms", 0, max_ms));
    options.itl = std::chrono::milliseconds(bounded(vm, "itl-ms", 0, max_ms));
    options.default_max_tokens = static_cast<std::uint64_t>(
        bounded(vm, "default-max-tokens", 1, std::numeric_limits<std::int32_t>::max()));
    options.keepalive_timeout = std::chrono::milliseconds(bounded(vm, "keepalive-timeout-ms", 1, max_ms));
    options.close_on_request = static_cast<std::uint64_t>(
        bounded(vm, "close-on-request", 0, std::numeric_limits<std::int64_t>::max()));
    options.threads = static_cast<unsigned>(bounded(vm, "threads", 1, 256));
    options.admin_port = static_cast<std::uint16_t>(bounded(vm, "admin-port", 0, 65535));
    read_balance(vm, options);
    read_kv_role(vm, options);

    options.simulate = vm["simulate"].as<bool>();
    if (!options.simulate) {
      for (const char* name :
           {"dp-lockstep", "time-scale", "start-after", "kv-blocks", "block-size", "no-enable-prefix-caching", "max-num-seqs", "max-num-batched-tokens", "step-base-us",
            "step-us-per-token", "prefill-us-per-token", "cudagraph-sizes", "kv-events-port", "kv-replay-port",
            "kv-events-topic", "kv-events-encoding", "kv-events-int-hashes", "kv-buffer-steps"}) {
        if (vm.count(name) != 0 && !vm[name].defaulted())
          throw std::invalid_argument("--" + std::string(name) + " needs --simulate");
      }
      return {std::move(options), 0};
    }
    if (options.ttft.count() != 0 || options.itl.count() != 0) {
      throw std::invalid_argument(
          "--ttft-ms and --itl-ms do not apply with --simulate (the step costs set the pace)");
    }
    options.dp_lockstep = vm["dp-lockstep"].as<bool>();
    options.time_scale = vm["time-scale"].as<double>();
    if (!(options.time_scale >= 0.001 && options.time_scale <= 10000)) {
      throw std::invalid_argument("--time-scale must be in [0.001, 10000]");
    }
    options.start_after = static_cast<std::uint64_t>(
        bounded(vm, "start-after", 0, std::numeric_limits<std::int64_t>::max()));
    auto& engine = options.engine;
    engine.kv.num_blocks = static_cast<std::uint32_t>(bounded(vm, "kv-blocks", 1, 1 << 26));
    engine.kv.block_size = static_cast<std::uint32_t>(bounded(vm, "block-size", 1, 1024));
    engine.kv.prefix_caching = !vm["no-enable-prefix-caching"].as<bool>();
    if (options.balance == dp_balance::oracle && !engine.kv.prefix_caching) {
      throw std::invalid_argument("--dp-balance oracle needs prefix caching (no --no-enable-prefix-caching)");
    }
    engine.max_num_seqs = static_cast<std::uint32_t>(bounded(vm, "max-num-seqs", 1, 65536));
    engine.max_num_batched_tokens =
        static_cast<std::uint32_t>(bounded(vm, "max-num-batched-tokens", 0, 1 << 24));
    if (engine.max_num_batched_tokens != 0 && engine.max_num_batched_tokens < engine.max_num_seqs) {
      // vLLM refuses the same: a budget below max_num_seqs could not even decode a full batch.
      throw std::invalid_argument("--max-num-batched-tokens must be 0 or >= --max-num-seqs");
    }
    engine.step_base = microseconds_option(vm, "step-base-us");
    engine.step_per_token = microseconds_option(vm, "step-us-per-token");
    engine.prefill_per_token = microseconds_option(vm, "prefill-us-per-token");
    if (engine.step_base.count() == 0 && engine.step_per_token.count() == 0) {
      throw std::invalid_argument(
          "--step-base-us and --step-us-per-token must not both be 0 (steps would take no time)");
    }
    engine.capture_sizes = vm.count("cudagraph-sizes") != 0
                               ? parse_sizes(vm["cudagraph-sizes"].as<std::string>())
                               : sim::default_capture_sizes(engine.max_num_seqs);
    read_kv_events(vm, options);
    return {std::move(options), 0};
  } catch (const std::exception& e) {
    err << "dplb-mock-engine: " << e.what() << " (see --help)\n";
    return {std::nullopt, 2};
  }
}

}  // namespace dplb::mock
