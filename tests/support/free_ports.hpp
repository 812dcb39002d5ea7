#pragma once
// Fixed ports for what cannot listen on an ephemeral one: the mock engine's KV-cache event publishers bind
// ports that dplb must be told in advance (vLLM's rule, rank j on a base port + j). A base is picked at
// random away from the ephemeral range, and taken when all its ports are free now (a race with another
// process remains possible, and is as unlikely as two random picks of 10,000 colliding).

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <random>
#include <stdexcept>

namespace dplb::test {

// Whether a TCP port on loopback is free now.
inline bool port_free(std::uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return false;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const bool free = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
  ::close(fd);
  return free;
}

// A base port whose `count` ports are all free.
inline std::uint16_t free_port_range(unsigned count) {
  static std::mt19937 random(std::random_device{}());
  for (int attempt = 0; attempt < 200; ++attempt) {
    const auto base = static_cast<std::uint16_t>(std::uniform_int_distribution<int>(20000, 30000)(random));
    bool all = true;
    for (unsigned i = 0; i < count && all; ++i) all = port_free(static_cast<std::uint16_t>(base + i));
    if (all) return base;
  }
  throw std::runtime_error("no free port range");
}

}  // namespace dplb::test
