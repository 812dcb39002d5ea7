#pragma once
// Whether a rank may receive new requests, decided from two kinds of evidence:
//  - active health checks: GET /health every interval; down after `unhealthy_threshold` consecutive
//    failed probes, up again after `healthy_threshold` consecutive good ones;
//  - passive outlier detection (as Envoy's): connect failures, resets and 5xx answers from real traffic.
//    After `ejection_threshold` consecutive ones the rank is ejected for a back-off that doubles on each
//    repeat (base, 2*base, 4*base, ... capped at max), then readmitted; a success resets the count, and
//    a rank that stays clean for a whole max back-off has its ejection history forgiven.
// A rank is usable when it is healthy and not ejected. Down ranks get no new requests; what is in flight
// on them finishes.
//
// Pure logic with time passed in: no I/O, no clock, no locking (the owner serialises calls).

#include <chrono>
#include <cstdint>
#include <optional>

namespace dplb::upstream {

struct health_policy {
  std::uint32_t unhealthy_threshold = 3;  // consecutive failed probes that take a rank down
  std::uint32_t healthy_threshold = 2;    // consecutive good probes that bring it back
  std::uint32_t ejection_threshold = 5;   // consecutive request failures that eject a rank (0 = never)
  std::chrono::milliseconds base_ejection{5'000};
  std::chrono::milliseconds max_ejection{300'000};
  // At most this share of the ranks is ejected at once (Envoy's max_ejection_percent): outlier
  // detection must never take the whole deployment out because every rank blipped together.
  std::uint32_t max_ejected_percent = 50;
};

// What a request's attempt on a rank showed about the rank.
enum class request_outcome {
  success,         // a response head arrived that is not a 5xx
  server_error,    // a 5xx response head
  connect_failure, // refused, unreachable, connect timeout
  reset,           // reset or closed before the response head on a fresh connection
  timeout,         // no response head within the first-byte timeout
};

class rank_health {
 public:
  using time_point = std::chrono::steady_clock::time_point;

  explicit rank_health(health_policy policy = {}) : policy_(policy) {}

  // Results of active probes.
  void probe_succeeded();
  void probe_failed();

  // A request's outcome (passive). Returns true when this outcome ejected the rank. With may_eject
  // false (too many ranks are ejected already) the failure is counted but ejects nothing.
  bool record(request_outcome outcome, time_point now, bool may_eject = true);

  // Ends an ejection whose time is up; call before reading usable() at `now`.
  void tick(time_point now);

  bool healthy() const noexcept { return healthy_; }
  bool ejected() const noexcept { return ejected_until_.has_value(); }
  bool usable() const noexcept { return healthy_ && !ejected(); }
  std::optional<time_point> ejected_until() const noexcept { return ejected_until_; }
  std::uint32_t times_ejected() const noexcept { return ejections_; }
  // Request failures since the last success or ejection: while 0, a success changes nothing.
  std::uint32_t consecutive_errors() const noexcept { return consecutive_errors_; }

 private:
  health_policy policy_;
  bool healthy_ = true;  // optimistic at start: traffic flows before the first probe
  std::uint32_t probe_failures_ = 0;
  std::uint32_t probe_successes_ = 0;
  std::uint32_t consecutive_errors_ = 0;
  std::uint32_t ejections_ = 0;  // in the current history window
  std::optional<time_point> ejected_until_;
  time_point last_ejection_end_{};
};

}  // namespace dplb::upstream
