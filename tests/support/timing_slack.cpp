#include "timing_slack.hpp"

// For Catch::TestEventListenerBase, which Catch2 v2 declares only on request.
#define CATCH_CONFIG_EXTERNAL_INTERFACES
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdlib>
#include <stdexcept>
#include <string>

namespace dplb::test {

namespace {

double read_timing_slack() {
  const char* text = std::getenv("DPLB_TEST_TIMING_SLACK");
  if (text == nullptr || *text == '\0') return 1.0;
  char* end = nullptr;
  const double value = std::strtod(text, &end);
  if (end == text || *end != '\0' || !std::isfinite(value) || value <= 0) {
    throw std::invalid_argument("DPLB_TEST_TIMING_SLACK='" + std::string(text) +
                                "' is not a positive number (e.g. 1, 4 or 8; unset means 1)");
  }
  return value;
}

// A listener, so that a bad value stops the run before its first test (Catch reports the exception and
// exits non-zero) instead of failing whichever test first multiplies a bound by it.
class timing_slack_check : public Catch::TestEventListenerBase {
 public:
  using TestEventListenerBase::TestEventListenerBase;
  void testRunStarting(const Catch::TestRunInfo& info) override {
    TestEventListenerBase::testRunStarting(info);
    timing_slack();
  }
};
CATCH_REGISTER_LISTENER(timing_slack_check)

}  // namespace

double timing_slack() {
  static const double slack = read_timing_slack();
  return slack;
}

}  // namespace dplb::test
