#pragma once
// Prefill/decode disaggregation, the pure part (--kv-role; see README "Prefill/decode roles"): vLLM's
// kv_transfer_params as a request carries them and a prefill answer returns them (NixlConnector's
// fields), the body of the mock's own pull (POST /internal/kv-pull, which stands in for NIXL's read of
// the prefill engine's blocks), and the table of blocks a prefill engine holds until they are pulled.

#include <chrono>
#include <cstdint>
#include <functional>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <variant>
#include <vector>

namespace dplb::mock {

struct engine_metrics;

// A request's "kv_transfer_params" (vLLM's NixlConnector): the router's leg 1 sets do_remote_decode
// (the prefill engine must keep the blocks for a decode engine); leg 2 passes the prefill answer's
// object on, with do_remote_prefill and where the blocks are.
struct kv_transfer_params {
  bool do_remote_decode = false;
  bool do_remote_prefill = false;
  std::string remote_engine_id;
  std::string remote_request_id;
  std::vector<std::uint64_t> remote_block_ids;
  std::string remote_host;
  std::uint16_t remote_port = 0;
  std::uint64_t tp_size = 1;
};

// The request's kv_transfer_params: none when absent or null; else the fields, or the message of a 400.
// Fields may be null (leg 1 sends them so); do_remote_prefill true needs remote_engine_id,
// remote_request_id, remote_host and remote_port (else there is nothing to pull from). Unknown fields
// are ignored, as vLLM passes the object to its connector whole.
std::variant<std::optional<kv_transfer_params>, std::string> read_kv_transfer_params(const nlohmann::json& request);

// The object a prefill answer carries at its top level, vLLM's order:
// {"do_remote_prefill":true,"do_remote_decode":false,"remote_block_ids":[..],"remote_engine_id":"..",
//  "remote_request_id":"..","remote_host":"..","remote_port":N,"tp_size":1}
nlohmann::ordered_json kv_transfer_answer(const kv_transfer_params& params);

// The blocks one prefill holds: synthetic ids, one per started block of block_size prompt tokens.
std::uint64_t blocks_for(std::uint64_t prompt_tokens, std::uint32_t block_size);

// POST /internal/kv-pull: {"remote_engine_id":"..","remote_request_id":".."}.
struct kv_pull_request {
  std::string remote_engine_id;
  std::string remote_request_id;
};
std::string render_kv_pull_request(const kv_pull_request& pull);
// The request, or the message of a 400.
std::variant<kv_pull_request, std::string> parse_kv_pull_request(std::string_view body);

// Its 200 answer: {"blocks":N,"prompt_tokens":M}.
struct kv_pulled {
  std::uint64_t blocks = 0;
  std::uint64_t prompt_tokens = 0;
};
std::string render_kv_pulled(const kv_pulled& pulled);
std::optional<kv_pulled> parse_kv_pulled(std::string_view body);

// The prefill side's holds, one table for the whole process (a pull may reach any rank's port): each
// prefill's blocks under (remote_engine_id, remote_request_id) until read once (take) or expired.
// Thread-safe. The owner's metrics follow: mock_kv_blocks_held while held, mock_kv_holds_expired_total
// when a hold times out.
class kv_hold_table {
 public:
  using clock = std::chrono::steady_clock;

  explicit kv_hold_table(std::chrono::milliseconds timeout) : timeout_(timeout) {}
  kv_hold_table(const kv_hold_table&) = delete;
  kv_hold_table& operator=(const kv_hold_table&) = delete;

  std::chrono::milliseconds timeout() const { return timeout_; }

  // Holds `blocks` new block ids for a prefill of `prompt_tokens` tokens until now + timeout. The
  // request id is `id_base` suffixed with a counter ("<id_base>-kv<n>"), unique in the process even when
  // a client reuses its X-Request-Id. Returns the answer's params (do_remote_prefill set).
  // `owner` (may be null) is the holding engine's metrics. `on_release` (may be empty) runs once when the
  // hold goes, taken or expired, outside the table's lock (with --simulate: it frees the engine's blocks).
  kv_transfer_params hold(std::string_view engine_id, std::string_view id_base, std::uint64_t blocks,
                          std::uint64_t prompt_tokens, engine_metrics* owner, clock::time_point now,
                          std::function<void()> on_release = {});

  // The hold, removed: a second take of it (or one after expiry) finds nothing, as NIXL reads once.
  std::optional<kv_pulled> take(std::string_view engine_id, std::string_view request_id);

  // Frees every hold whose deadline is <= now; returns how many.
  std::size_t expire(clock::time_point now);

  std::uint64_t blocks_held() const;
  std::size_t size() const;

 private:
  struct held {
    std::uint64_t blocks = 0;
    std::uint64_t prompt_tokens = 0;
    clock::time_point deadline;
    engine_metrics* owner = nullptr;
    std::function<void()> on_release;
  };
  static std::string key(std::string_view engine_id, std::string_view request_id);
  static void release(const held& h);

  const std::chrono::milliseconds timeout_;
  mutable std::mutex mutex_;
  std::unordered_map<std::string, held> holds_;
  std::uint64_t blocks_held_ = 0;
  std::uint64_t next_suffix_ = 0;
  std::uint64_t next_block_id_ = 0;
};

}  // namespace dplb::mock
