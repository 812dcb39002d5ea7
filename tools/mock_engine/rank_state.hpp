#pragma once
// What all threads share about one port (a DP rank of --ranks, vLLM's external LB) and the DP engines
// it serves (--dp, vLLM's internal LB): the port's faults, counters and metrics overrides, and per
// engine its metrics and, with --simulate, its place in the simulation.

#include <atomic>
#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <vector>

#include "engine_metrics.hpp"
#include "faults.hpp"
#include "guarded.hpp"

namespace dplb::mock {

class sim_engine;
class kv_hold_table;

struct engine_state {
  engine_state(unsigned engine_index, std::string engine_label, unsigned simulation_index)
      : index(engine_index), label(std::move(engine_label)), sim_index(simulation_index) {}

  const unsigned index;       // on its port, 0..dp-1: the x-mock-engine header
  const std::string label;    // its engine="..." label: the index, or the port's rank with --dp 1
  const unsigned sim_index;   // its scheduler in the simulation: over all the process's engines
  engine_metrics metrics;
  guarded<gauge_overrides> overrides;  // set through the admin port
  // With --simulate, the engine that schedules this engine's requests (set at start-up); else null.
  sim_engine* simulation = nullptr;
};

// One completions/chat request as the admin port's /stats lists it.
struct routed_request {
  std::optional<unsigned> engine;           // none: refused (X-data-parallel-rank out of range)
  std::optional<std::string> header_value;  // X-data-parallel-rank as received
};

struct rank_state {
  // The port's engines are labelled by their index, except the one engine of a --dp 1 port, which
  // keeps the port's rank as its label (the mock's output before --dp existed).
  rank_state(unsigned rank_index, unsigned engine_count, unsigned first_sim_index)
      : index(rank_index), label(std::to_string(rank_index)) {
    for (unsigned j = 0; j < engine_count; ++j) {
      engines.emplace_back(j, engine_count == 1 ? label : std::to_string(j), first_sim_index + j);
    }
  }

  static constexpr std::size_t recent_limit = 1024;  // requests kept in `recent`

  // Appends to `recent`, dropping the oldest beyond recent_limit.
  void log(routed_request request) {
    recent.update([&](std::deque<routed_request>& log) {
      log.push_back(std::move(request));
      if (log.size() > recent_limit) log.pop_front();
    });
  }

  // The engine="..." label of the port's own series: the rank with --dp 1, none with several engines.
  std::string port_label() const { return engines.size() == 1 ? label : std::string{}; }

  const unsigned index;
  const std::string label;  // the index as text: the x-mock-rank header
  std::deque<engine_state> engines;
  port_metrics metrics;
  rank_faults faults;  // set through the admin port
  // Set through the admin port: /metrics answers exactly this text instead of the rendered one.
  guarded<std::optional<std::string>> raw_metrics;
  guarded<std::deque<routed_request>> recent;  // the last completions/chat requests, oldest first
  // With --kv-role prefill, the process's one table of blocks held for decode engines (set at
  // start-up, shared by every port: a pull may come to any of them); else null.
  kv_hold_table* kv_holds = nullptr;
  // Id suffix for generation requests without x-request-id (cmpl-<n>, chatcmpl-<n>).
  std::atomic<std::uint64_t> next_request_id{0};
};

// The port's /metrics text: the raw override if set, else every engine's series.
std::string port_metrics_text(const rank_state& rank, std::string_view model_name);

// The admin port's GET /stats: for each port (ports[i] is rank i's), per engine the completions/chat
// requests routed to it (by X-data-parallel-rank or not) and in flight, and the port's recent requests
// with the engine that served each and the X-data-parallel-rank value it carried:
// {"ports":[{"rank":0,"port":8100,"engines":[{"engine":0,"requests_routed":2,
//   "requests_routed_by_header":1,"requests_in_flight":0},..],
//   "recent":[{"engine":0,"x_data_parallel_rank":"0"},{"engine":null,"x_data_parallel_rank":"9"},..]},..]}
// ("engine":null: refused with 400; "x_data_parallel_rank":null: no header).
std::string render_stats(const std::deque<rank_state>& ranks, const std::vector<std::uint16_t>& ports);

}  // namespace dplb::mock
