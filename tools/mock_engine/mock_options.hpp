#pragma once
// The mock engine's command line: one plain struct and the parser that fills it. Pure (no sockets), so
// the contract the tests rely on lives in one place.

#include <chrono>
#include <cstdint>
#include <iosfwd>
#include <optional>
#include <string>

#include "batch_scheduler.hpp"
#include "kv_event_encoder.hpp"

namespace dplb::mock {

// The engine's part in prefill/decode disaggregation (--kv-role; kv_transfer.hpp): vLLM's NixlConnector
// roles, seen from the HTTP side. `both` ignores kv_transfer_params altogether (the mock as before).
enum class kv_role {
  both,     // no disaggregation: every request is served whole
  prefill,  // do_remote_decode requests: prefill, answer kv_transfer_params, hold the blocks for a pull
  decode,   // do_remote_prefill requests: pull the blocks from the prefill engine, then generate
};

// How a port picks the engine of a request that names none (--dp-balance; dp_routing.hpp).
enum class dp_balance {
  least_inflight,  // the fewest requests in flight, the lowest index on a tie (vLLM's internal LB, simplified)
  oracle,          // the longest cached prefix of the prompt within a load bound (needs --simulate)
};

struct mock_options {
  std::string host = "127.0.0.1";         // IP literal or a name resolved at start-up
  std::uint16_t port = 8100;              // rank i listens on port + i; 0 = an ephemeral port per rank
  unsigned ranks = 1;                     // ports served by this one process (vLLM's external LB)
  // DP engines behind each port (vLLM's internal LB, `--data-parallel-size N` behind one URL): each a
  // full engine of its own; X-data-parallel-rank picks one, else the port balances (dp_routing.hpp).
  unsigned dp = 1;
  dp_balance balance = dp_balance::least_inflight;
  // --load-bound C of the oracle (>= 1): an engine may take a request only while it then has at most
  // ceil(C * (the port's requests in flight + 1) / dp) in flight.
  double load_bound = 1.25;
  std::string model = "mock-model";       // the only model name accepted and listed
  std::chrono::milliseconds ttft{0};      // wait before the first token
  std::chrono::milliseconds itl{0};       // wait between two tokens
  std::uint64_t default_max_tokens = 16;  // completion tokens when the request sets none
  std::chrono::milliseconds keepalive_timeout{5000};  // an idle connection is closed silently after this
  // Drop the N-th request of every connection after reading its head (no response byte): the
  // keep-alive race seen from the proxy. 0 = off.
  std::uint64_t close_on_request = 0;
  unsigned threads = 1;  // event-loop threads, each with its own io_context and SO_REUSEPORT acceptors
  // The admin listener (fault injection, see admin_api.hpp) on host:admin_port; 0 = an ephemeral port.
  std::uint16_t admin_port = 0;

  // Simulated serving (see sim_engine.hpp). Off: each request paces its own tokens (ttft, itl), as
  // before any of these existed.
  bool simulate = false;
  // All ranks step together (MoE DP): each step lasts as long as the slowest rank's padded batch, and
  // idle ranks run dummy batches. Off: each rank steps on its own clock. Needs `simulate`.
  bool dp_lockstep = false;
  // Simulated time runs this many times faster than wall time (every simulated duration is divided by
  // it). Needs `simulate`.
  double time_scale = 1.0;
  // No step runs until this many requests have arrived (all ranks together): a burst benchmark's t=0,
  // so that how fast the client delivers the burst does not leak into the engine's timing. 0 = off.
  std::uint64_t start_after = 0;
  // The simulated engine: max_num_seqs, max_num_batched_tokens, capture sizes, step costs and the KV
  // cache (blocks, block size, prefix caching), with the defaults of batch_scheduler.hpp (a large MoE,
  // one modern GPU per rank; --help says why).
  sim::engine_config engine;

  // vLLM's KV-cache events (kv_event_publisher.hpp; needs `simulate`): global engine e (engine j of rank
  // i is e = i * dp + j) publishes on kv_events_port + e and, if kv_replay_port is set, answers replay
  // requests on kv_replay_port + e. 0 = off. Fixed ports only: dplb must know them in advance.
  std::uint16_t kv_events_port = 0;
  std::uint16_t kv_replay_port = 0;
  std::string kv_events_topic;  // every message's first frame (vLLM's default: empty)
  kv_event_encoding kv_events_encoding = kv_event_encoding::map;
  bool kv_events_int_hashes = false;  // block hashes as integers, not 32-byte bins
  std::uint64_t kv_buffer_steps = 10000;  // batches kept per engine for replay (vLLM's buffer_steps)

  // Prefill/decode disaggregation (kv_transfer.hpp). A prefill engine holds a prefill's blocks until a
  // decode engine pulls them or kv_hold_timeout passes (vLLM's VLLM_NIXL_ABORT_REQUEST_TIMEOUT, 480 s).
  // A decode engine waits kv_transfer_per_block per pulled block before its first token (wall time,
  // divided by --time-scale with --simulate).
  kv_role role = kv_role::both;
  std::chrono::milliseconds kv_hold_timeout{480'000};
  std::chrono::nanoseconds kv_transfer_per_block{20'000};
};

// Either options to run with, or the process exit status (0 after --help, 2 after a bad command line).
struct command_line_result {
  std::optional<mock_options> options;
  int exit_code = 0;
};

// Parses argv; --help text goes to `out`, one-line errors ("dplb-mock-engine: ...") to `err`.
command_line_result parse_command_line(int argc, const char* const* argv, std::ostream& out,
                                       std::ostream& err);

}  // namespace dplb::mock
