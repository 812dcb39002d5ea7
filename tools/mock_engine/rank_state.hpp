#pragma once
// What all threads share about one DP rank: its index, its metrics, its faults and its request-id counter.

#include <atomic>
#include <cstdint>
#include <string>

#include "engine_metrics.hpp"
#include "faults.hpp"

namespace dplb::mock {

struct rank_state {
  explicit rank_state(unsigned rank_index) : index(rank_index), label(std::to_string(rank_index)) {}

  const unsigned index;
  const std::string label;  // the index as text: the x-mock-rank header and the engine label
  engine_metrics metrics;
  rank_faults faults;  // set through the admin port
  // Id suffix for generation requests without x-request-id (cmpl-<n>, chatcmpl-<n>).
  std::atomic<std::uint64_t> next_request_id{0};
};

}  // namespace dplb::mock
