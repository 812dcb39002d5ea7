#pragma once
// How much longer than on a plain build a timing bound in a test may take. Sanitizers slow dplb and the
// mock engine several times over, and a loaded machine slows them too: every bound is multiplied by this
// factor, never removed. It comes from DPLB_TEST_TIMING_SLACK at run time (a positive number; unset or
// empty: 1), so that one build can be run with more slack without recompiling. scripts/test.sh sets it
// from DPLB_SANITIZE.
//
// The test support scales its own deadlines (await_until and await_metrics, child_process::wait_for_line
// and stop, raw_engine's awaits, http_connection's connect and request deadlines), so a test passes them
// as on a plain build; a bound a test checks itself (CHECK(took < 1500ms * timing_slack())) it scales itself.
// Never scaled: lower bounds, and durations that are not deadlines (http_connection::read_for).

#include <chrono>

namespace dplb::test {

// The factor, read once. A value that is not a positive number throws std::invalid_argument; the test
// run checks it before the first test starts, so a typo fails the whole run at once, not one test late.
double timing_slack();

// `bound` times the slack: a deadline or upper bound as it holds on this run.
inline std::chrono::milliseconds scaled(std::chrono::milliseconds bound) {
  return std::chrono::milliseconds(static_cast<std::chrono::milliseconds::rep>(static_cast<double>(bound.count()) *
                                                                               timing_slack()));
}

}  // namespace dplb::test
