#pragma once
// A real redis-server for the ledger's tests: on loopback, on a free port, persisting nothing, stopped by
// its own pid when the test ends. Ready once it answers a PING (a connect, not a sleep).

#include "child_process.hpp"
#include "free_ports.hpp"
#include "timing_slack.hpp"

#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace dplb::test {

// Whether a Redis on loopback answers PING now (a blocking exchange bounded by a short socket timeout).
inline bool redis_answers(std::uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return false;
  timeval tv{0, 200000};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bool ok = false;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 && ::write(fd, "PING\r\n", 6) == 6) {
    char reply[16] = {};
    // With a password, the answer is an error asking for it: the server is up all the same.
    ok = ::read(fd, reply, sizeof reply - 1) > 0 &&
         (std::string(reply).rfind("+PONG", 0) == 0 || std::string(reply).rfind("-NOAUTH", 0) == 0);
  }
  ::close(fd);
  return ok;
}

class redis_server {
 public:
  // port 0: a free one. extra: more redis-server options (e.g. {"--requirepass", "..."}).
  explicit redis_server(std::uint16_t port = 0, std::vector<std::string> extra = {})
      : port_(port ? port : free_port_range(1)) {
    std::vector<std::string> args{"--port", std::to_string(port_), "--bind", "127.0.0.1", "--save", "",
                                  "--appendonly", "no", "--loglevel", "warning"};
    args.insert(args.end(), extra.begin(), extra.end());
    process_ = std::make_unique<child_process>("/usr/bin/redis-server", args);
    const auto until = std::chrono::steady_clock::now() + scaled(std::chrono::seconds(5));
    while (!redis_answers(port_)) {
      if (std::chrono::steady_clock::now() > until || !process_->running()) {
        throw std::runtime_error("redis-server did not answer on port " + std::to_string(port_) + ":\n" +
                                 process_->output());
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));  // paces the polling; the PING is the event
    }
  }

  std::uint16_t port() const { return port_; }
  pid_t pid() const { return process_->pid(); }
  void stop() { process_.reset(); }

 private:
  std::uint16_t port_;
  std::unique_ptr<child_process> process_;
};

}  // namespace dplb::test
