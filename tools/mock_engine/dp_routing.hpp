#pragma once
// Which DP engine of a port serves a request: vLLM's X-data-parallel-rank header, else the port's own
// balancing (vLLM's internal LB). Pure, so that the rules are unit-tested without sockets.
//
//   --dp N > 1 (internal LB): an integer j in [0, N) picks engine j; any other integer is refused (400).
//   --dp 1 (external LB, one engine per port): 0 or the port's own global rank i (rank i of --ranks K
//     listens on PORT+i, as vLLM's external-LB rank i answers to its own rank) picks the one engine;
//     any other integer is refused.
//   A value that is not an integer is ignored (vLLM ignores it too), as is no header: the port then
//   balances, by --dp-balance: least_busy (least-inflight, the default), or choose_by_cached_prefix
//   (oracle: what a router that knew every engine's KV cache exactly would pick).

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>

namespace dplb::mock {

inline constexpr std::string_view dp_rank_header = "x-data-parallel-rank";

// No preference (no header, or not an integer): the port balances.
struct any_engine {};

// What a request asks of its port: any engine, the engine of that index, or (a value the port does
// not serve) the message of the 400 that refuses it.
using engine_wish = std::variant<any_engine, unsigned, std::string>;

// The header as read by a port with `engines` engines whose global rank is `own_rank` (--dp 1).
engine_wish read_dp_rank_header(std::optional<std::string_view> header, unsigned engines, unsigned own_rank);

// The internal LB: the engine with the fewest requests in flight, the lowest index on a tie.
// `in_flight(j)` gives engine j's count; engines >= 1.
template <class InFlight>
unsigned least_busy(unsigned engines, InFlight in_flight) {
  unsigned best = 0;
  auto best_load = in_flight(0U);
  for (unsigned j = 1; j < engines; ++j) {
    const auto load = in_flight(j);
    if (load < best_load) {
      best = j;
      best_load = load;
    }
  }
  return best;
}

// What the oracle knows of one engine of a port when a request arrives.
struct engine_outlook {
  std::size_t cached_blocks = 0;  // leading blocks of the prompt's block-hash chain its KV cache holds
  std::int64_t in_flight = 0;     // requests routed to it and not answered yet
};

// The most requests in flight an engine may have once it takes the next one, for a port whose
// engines have `total_in_flight` requests in flight: ceil(load_bound * (total_in_flight + 1) / engines).
// load_bound >= 1; engines >= 1.
std::int64_t in_flight_ceiling(std::int64_t total_in_flight, unsigned engines, double load_bound);

// --dp-balance oracle: among the engines allowed by the load bound (in_flight + 1 <= in_flight_ceiling),
// the one holding the longest cached prefix of the prompt, ties to the fewest in flight, then the lowest
// index. When no allowed engine holds even one block: least_busy over all engines (which is always
// allowed, see the definition). `engines` not empty.
unsigned choose_by_cached_prefix(std::span<const engine_outlook> engines, double load_bound);

}  // namespace dplb::mock
