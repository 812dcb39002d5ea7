#pragma once
// The mock engine process: every rank's listeners, the admin listener that injects faults, the
// event-loop threads and the signal handling. Asio stays behind a pointer so that main.cpp compiles in
// a blink.

#include <cstdint>
#include <memory>
#include <vector>

#include "mock_options.hpp"

namespace dplb::mock {

class mock_server {
 public:
  // Binds and listens on every rank's port and on the admin port (throws std::exception with a
  // readable message if one cannot be bound). Nothing is served until run().
  explicit mock_server(const mock_options& options);
  ~mock_server();
  mock_server(const mock_server&) = delete;
  mock_server& operator=(const mock_server&) = delete;

  // ports()[i] is rank i's bound port (useful with --port 0); it stays the same when a "listening"
  // fault closes and re-opens the rank.
  const std::vector<std::uint16_t>& ports() const;

  // The admin listener's bound port (useful with --admin-port 0).
  std::uint16_t admin_port() const;

  // Serves on options.threads threads (this one included) until SIGINT or SIGTERM arrives.
  void run();

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

}  // namespace dplb::mock
