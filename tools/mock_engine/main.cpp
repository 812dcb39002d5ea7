// dplb-mock-engine: a fake vLLM engine for dplb's tests, demo and benchmarks (see --help).

#include <exception>
#include <iostream>

#include "mock_options.hpp"
#include "mock_server.hpp"

int main(int argc, char** argv) {
  auto parsed = dplb::mock::parse_command_line(argc, argv, std::cout, std::cerr);
  if (!parsed.options) return parsed.exit_code;
  const auto& options = *parsed.options;
  try {
    dplb::mock::mock_server server(options);
    // Tests wait for these exact lines; each is flushed so a pipe sees it at once.
    for (std::size_t rank = 0; rank < server.ports().size(); ++rank) {
      std::cout << "mock-engine rank " << rank << " listening on " << options.host << ':'
                << server.ports()[rank] << std::endl;
      // Only with --dp > 1, so that the output of a --dp 1 mock stays what tools already parse.
      if (options.dp > 1) std::cout << "mock-engine rank " << rank << " serves " << options.dp << " DP engines" << std::endl;
      // Only with --kv-events-port: engine j of rank i is global engine e = i * dp + j, on base + e.
      for (unsigned engine = 0; options.kv_events_port != 0 && engine < options.dp; ++engine) {
        const auto e = static_cast<unsigned>(rank) * options.dp + engine;
        std::cout << "mock-engine rank " << rank << " engine " << engine << " kv-events tcp://" << options.host
                  << ':' << options.kv_events_port + e;
        if (options.kv_replay_port != 0)
          std::cout << " kv-replay tcp://" << options.host << ':' << options.kv_replay_port + e;
        std::cout << std::endl;
      }
    }
    std::cout << "mock-engine admin listening on " << options.host << ':' << server.admin_port() << std::endl;
    std::cout << "mock-engine ready" << std::endl;
    server.run();
  } catch (const std::exception& e) {
    std::cerr << "dplb-mock-engine: " << e.what() << '\n';
    return 1;
  }
  return 0;
}
