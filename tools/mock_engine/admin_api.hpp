#pragma once
// The admin port's HTTP API, as plain functions: which request means what. The server executes the
// commands (it owns the listeners that "listening" opens and closes); session.cpp moves the bytes.
//
//   GET    /fault?rank=<i>        the rank's fault state (render_fault_settings)
//   POST   /fault?rank=<i>        body: JSON object of fault fields to set (absent fields unchanged)
//   DELETE /fault?rank=<i>        back to normal behaviour; POST /fault/clear?rank=<i> is the same
//   GET    /metrics?rank=<i>      the rank's /metrics text, readable even while the rank is faulted
//   GET|POST /metrics/override?rank=<i>&engine=<j>   engine j's gauge overrides; POST sets the fields
//                                  of a JSON body (metrics_override.hpp) and answers the new state
//   DELETE /metrics/override       clears every override of every engine
//   POST   /metrics/raw?rank=<i>   the rank's /metrics answers exactly the body, until
//   DELETE /metrics/raw?rank=<i>   ... this
//   GET    /stats                  per port and engine: requests routed, and the recent requests
//   POST   /kv-events/publish?rank=<i>&engine=<j>[&seq=<S>]   the body, raw, as the payload of engine j's
//                                  next KV-events message (seq S instead of the next, then S+1, ...)
//   POST   /kv-events/reset?rank=<i>[&engine=<j>]   resets the prefix cache of engine j (else of every
//                                  engine of the rank), which publishes AllBlocksCleared
// Answers are JSON (but /metrics): 200 with the state, 400/404/405 with vLLM's error shape.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>

#include "faults.hpp"
#include "metrics_override.hpp"

namespace dplb::mock {

enum class admin_action {
  get_fault,
  set_fault,
  clear_fault,
  get_metrics,
  get_override,
  set_override,
  clear_overrides,
  set_raw_metrics,
  clear_raw_metrics,
  get_stats,
  publish_kv_event,
  reset_kv_cache,
};

struct admin_command {
  admin_action action = admin_action::get_fault;
  unsigned rank = 0;    // the actions that name a rank
  unsigned engine = 0;  // get_override and set_override
  fault_patch patch;    // set_fault only
  gauge_override_patch override_patch;  // set_override only
  std::string raw_metrics;              // set_raw_metrics only
  bool all_engines = false;             // reset_kv_cache without engine=
  std::optional<std::int64_t> seq;      // publish_kv_event's seq=, if given
  std::string payload;                  // publish_kv_event only: the body
};

struct admin_answer {
  unsigned status = 200;
  std::string_view content_type = "application/json";
  std::string body;
};

// A command to execute, or the error answer for a request that is not one (bad path, method, rank or
// body). `ranks` is the number of ranks (ports) served, `engines` the DP engines of each.
std::variant<admin_command, admin_answer> parse_admin_request(std::string_view method,
                                                              std::string_view target, std::string_view body,
                                                              unsigned ranks, unsigned engines);

// The error answer for a command that failed while executing (e.g. a port that cannot be re-bound).
admin_answer admin_failure(unsigned status, std::string_view message);

}  // namespace dplb::mock
