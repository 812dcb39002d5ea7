#pragma once
// Fault injection: what a rank does wrong, set at run time through the admin port (see admin_api.hpp).
// The settings and their JSON are plain C++; rank_faults is the copy every event-loop thread reads.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>

namespace dplb::mock {

// One rank's faults. The defaults are normal behaviour.
struct fault_settings {
  unsigned health_status = 200;  // GET /health answers this status, empty body (200..599)
  // POST /v1/completions and /v1/chat/completions answer this status at once, with vLLM's error JSON
  // for it (400..599); 0 = off.
  unsigned status = 0;
  // Completions/chat: reset the connection (RST) as soon as the request head is read; no response byte.
  bool reset_on_request = false;
  // Streaming completions/chat: send this many token events (the chat role event not counted), then
  // reset the connection instead of the usage event, [DONE] and the last chunk. 0 = off.
  std::uint64_t reset_after_events = 0;
  // Completions/chat: wait this long (after reading the body) before any response byte; a client
  // leaving meanwhile aborts the request. 0 = off.
  std::chrono::milliseconds stall{0};
  // false: the rank's acceptors are closed (connections refused) and its open connections closed.
  bool listening = true;
  // Connections are accepted but never answered: bytes are read and dropped until the client closes.
  bool accept_but_ignore = false;

  bool operator==(const fault_settings&) const = default;
};

// A POST /fault body: the fields it sets; absent ones stay as they are.
struct fault_patch {
  std::optional<unsigned> health_status;
  std::optional<unsigned> status;
  std::optional<bool> reset_on_request;
  std::optional<std::uint64_t> reset_after_events;
  std::optional<std::chrono::milliseconds> stall;
  std::optional<bool> listening;
  std::optional<bool> accept_but_ignore;
};

// Parses a JSON object of fault fields ("stall_ms" for `stall`); an empty body is {}. On failure the
// result is a one-line reason naming the field (unknown field, wrong type, out of range).
std::variant<fault_patch, std::string> parse_fault_patch(std::string_view body);

// `settings` with the patch's fields replaced.
fault_settings patched(fault_settings settings, const fault_patch& patch);

// {"health_status":200,"status":0,"reset_on_request":false,"reset_after_events":0,"stall_ms":0,
//  "listening":true,"accept_but_ignore":false}: a valid POST /fault body that sets exactly this state.
std::string render_fault_settings(const fault_settings& settings);

// vLLM's error JSON for an injected status: type from the reason phrase ("Service Unavailable" ->
// "ServiceUnavailableError", 500 -> "InternalServerError"), code = status.
std::string injected_error_body(unsigned status);

// One rank's faults as every thread sees them. Each field is its own relaxed atomic: a session reads
// the field it needs when it needs it, so a change applies from the next request (or the next step of
// a running one). Written only by the admin port's thread.
class rank_faults {
 public:
  fault_settings load() const;
  void store(const fault_settings& settings);

  unsigned health_status() const { return health_status_.load(std::memory_order_relaxed); }
  unsigned status() const { return status_.load(std::memory_order_relaxed); }
  bool reset_on_request() const { return reset_on_request_.load(std::memory_order_relaxed); }
  std::uint64_t reset_after_events() const { return reset_after_events_.load(std::memory_order_relaxed); }
  std::chrono::milliseconds stall() const {
    return std::chrono::milliseconds(stall_ms_.load(std::memory_order_relaxed));
  }
  bool accept_but_ignore() const { return accept_but_ignore_.load(std::memory_order_relaxed); }

 private:
  std::atomic<unsigned> health_status_{200};
  std::atomic<unsigned> status_{0};
  std::atomic<bool> reset_on_request_{false};
  std::atomic<std::uint64_t> reset_after_events_{0};
  std::atomic<std::int64_t> stall_ms_{0};
  std::atomic<bool> listening_{true};  // what the admin port last set; the listeners act on it
  std::atomic<bool> accept_but_ignore_{false};
};

}  // namespace dplb::mock
