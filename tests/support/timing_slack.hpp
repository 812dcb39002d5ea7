#pragma once
// How much longer than on a plain build a timing bound in a test may take. Sanitizers slow dplb and the
// mock engine several times over, and a loaded machine slows them too: every bound is multiplied by this
// factor, never removed. It comes from DPLB_TEST_TIMING_SLACK at run time (a positive number; unset or
// empty: 1), so that one build can be run with more slack without recompiling. scripts/test.sh sets it
// from DPLB_SANITIZE.

namespace dplb::test {

// The factor, read once. A value that is not a positive number throws std::invalid_argument; the test
// run checks it before the first test starts, so a typo fails the whole run at once, not one test late.
double timing_slack();

}  // namespace dplb::test
