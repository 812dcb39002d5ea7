#pragma once
// The admin port's HTTP API, as plain functions: which request means what. The server executes the
// commands (it owns the listeners that "listening" opens and closes); session.cpp moves the bytes.
//
//   GET    /fault?rank=<i>        the rank's fault state (render_fault_settings)
//   POST   /fault?rank=<i>        body: JSON object of fault fields to set (absent fields unchanged)
//   DELETE /fault?rank=<i>        back to normal behaviour; POST /fault/clear?rank=<i> is the same
//   GET    /metrics?rank=<i>      the rank's /metrics text, readable even while the rank is faulted
// Answers are JSON: 200 with the state, 400/404/405 with vLLM's error shape.

#include <string>
#include <string_view>
#include <variant>

#include "faults.hpp"

namespace dplb::mock {

enum class admin_action { get_fault, set_fault, clear_fault, get_metrics };

struct admin_command {
  admin_action action = admin_action::get_fault;
  unsigned rank = 0;
  fault_patch patch;  // set_fault only
};

struct admin_answer {
  unsigned status = 200;
  std::string_view content_type = "application/json";
  std::string body;
};

// A command to execute, or the error answer for a request that is not one (bad path, method, rank or
// body). `ranks` is the number of ranks served.
std::variant<admin_command, admin_answer> parse_admin_request(std::string_view method,
                                                              std::string_view target, std::string_view body,
                                                              unsigned ranks);

// The error answer for a command that failed while executing (e.g. a port that cannot be re-bound).
admin_answer admin_failure(unsigned status, std::string_view message);

}  // namespace dplb::mock
