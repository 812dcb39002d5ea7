#pragma once
// The timing loop of the bench/cost microbenchmarks: `f(i)` run `ops` times per round, 7 rounds, and the
// median round's time per operation in `Unit` (std::nano, std::micro). The median, so that a round a
// shared machine interrupts does not move the figure.
#include <algorithm>
#include <chrono>
#include <vector>

namespace dplb::bench {

template <class Unit, class F>
double median_per_op(int ops, F&& f) {
  std::vector<double> rounds;
  for (int round = 0; round < 7; ++round) {
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < ops; ++i) f(i);
    rounds.push_back(std::chrono::duration<double, Unit>(std::chrono::steady_clock::now() - start).count() / ops);
  }
  std::sort(rounds.begin(), rounds.end());
  return rounds[rounds.size() / 2];
}

}  // namespace dplb::bench
