#pragma once
// What all threads share about one DP rank: its index, its metrics, its faults, its request-id counter
// and, with --simulate, its engine.

#include <atomic>
#include <cstdint>
#include <string>

#include "engine_metrics.hpp"
#include "faults.hpp"

namespace dplb::mock {

class sim_engine;

struct rank_state {
  explicit rank_state(unsigned rank_index) : index(rank_index), label(std::to_string(rank_index)) {}

  const unsigned index;
  const std::string label;  // the index as text: the x-mock-rank header and the engine label
  engine_metrics metrics;
  rank_faults faults;  // set through the admin port
  // Id suffix for generation requests without x-request-id (cmpl-<n>, chatcmpl-<n>).
  std::atomic<std::uint64_t> next_request_id{0};
  // With --simulate, the engine that schedules this rank's requests (set at start-up); else null.
  sim_engine* simulation = nullptr;
};

}  // namespace dplb::mock
