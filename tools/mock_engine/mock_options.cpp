#include "mock_options.hpp"

#include <boost/program_options.hpp>
#include <cstdint>
#include <limits>
#include <ostream>
#include <stdexcept>

namespace dplb::mock {
namespace {

namespace po = boost::program_options;

// Everything about the mock that the option list alone does not say; the tests and the demo depend on it.
constexpr const char* help_epilogue = R"(
Start-up: once every rank and the admin port listen, stdout gets one line per rank, the admin line,
then a last line:
  mock-engine rank <i> listening on <host>:<port>
  mock-engine admin listening on <host>:<admin-port>
  mock-engine ready
SIGTERM or SIGINT closes everything and exits 0. Every response carries `x-mock-rank: <i>`.

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
  GET /v1/models, /version, /health (200, empty), GET|POST /ping, GET /metrics (Prometheus text:
      vllm:num_requests_running/_waiting, vllm:kv_cache_usage_perc, vllm:prompt_tokens_total,
      vllm:generation_tokens_total, vllm:request_success_total and the mock_* counters:
      mock_requests_received_total, _aborted_total, _dropped_total, _reset_total,
      mock_health_checks_total, mock_connections_accepted_total, mock_connections_open,
      mock_connections_closed_by_fault_total; each with the label engine="<i>").
  /mock/echo       (any method) JSON: method, target, headers (in received order), body_size,
                   body_fnv1a64 (FNV-1a 64, 16 hex digits), chunked (request body was chunked).
  /mock/echo-body  (any method) the request body back, application/octet-stream.
  /mock/stream?events=N&interval_ms=M&bytes=B   N SSE events (default 10, 0 ms, 0 bytes), one per
                   chunk every M ms: data: {"i":<0..N-1>,"t_us":<CLOCK_MONOTONIC us at write>,
                   "pad":"x..."} padded to about B bytes, then data: [DONE].
  Anything else: 404 {"detail":"Not Found"}.
Limits: request head 64 KiB (431), request body 64 MiB (413); each body read and write: 60 s.

Fault injection, on the admin port (always up, whatever the faults; answers JSON):
  GET    /fault?rank=<i>        the rank's fault state
  POST   /fault?rank=<i>        body: a JSON object of the fields below to set (absent: unchanged; {}
                                changes nothing); answers the new state
  DELETE /fault?rank=<i>        back to normal (also POST /fault/clear?rank=<i>); answers the state
  GET    /metrics?rank=<i>      the rank's /metrics text (reachable while the rank is faulted)
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

// Reads an integer option and checks its range; signed reading so that "-1" is refused, not wrapped.
std::int64_t bounded(const po::variables_map& vm, const char* name, std::int64_t min, std::int64_t max) {
  const auto value = vm[name].as<std::int64_t>();
  if (value < min || value > max) {
    throw std::invalid_argument("--" + std::string(name) + " must be in [" + std::to_string(min) + ", " +
                                std::to_string(max) + "], got " + std::to_string(value));
  }
  return value;
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
    ("ranks", po::value<std::int64_t>()->value_name("K")->default_value(defaults.ranks), "number of DP ranks served")
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
    return {std::move(options), 0};
  } catch (const std::exception& e) {
    err << "dplb-mock-engine: " << e.what() << " (see --help)\n";
    return {std::nullopt, 2};
  }
}

}  // namespace dplb::mock
