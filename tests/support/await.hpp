#pragma once
// Awaiting an observable condition in an integration test: fetch, test, and fetch again until the
// predicate holds or the deadline passes (then the last value is returned and the test's own check
// fails with it). The short pause between fetches only paces the polling; the predicate is the event.
// The deadline is scaled by the timing slack (timing_slack.hpp).

#include <chrono>
#include <map>
#include <string>
#include <thread>

#include "http_client.hpp"
#include "timing_slack.hpp"

namespace dplb::test {

template <class Fetch, class Pred>
auto await_until(Fetch fetch, Pred pred, std::chrono::milliseconds deadline = std::chrono::seconds(5)) {
  const auto until = steady::now() + scaled(deadline);
  auto value = fetch();
  while (!pred(value) && steady::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    value = fetch();
  }
  return value;
}

// dplb's (or an engine's) /metrics on that port, once the predicate holds over it.
template <class Pred>
std::map<std::string, double> await_metrics(std::uint16_t port, Pred pred,
                                            std::chrono::milliseconds deadline = std::chrono::seconds(5)) {
  return await_until([&] { return scrape_metrics(port); }, pred, deadline);
}

}  // namespace dplb::test
