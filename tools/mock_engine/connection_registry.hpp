#pragma once
// The open connections of one rank on one event-loop thread, so that "listening": false can close them
// all at once. Used only by that thread: connections add and remove themselves, and the close runs
// there as a posted task.

#include <list>

namespace dplb::mock {

// A connection that the server can close from outside its coroutine.
class closable_connection {
 public:
  // Closes the socket (the peer sees the close); the connection's coroutine then ends on its own.
  // Must not destroy the connection synchronously.
  virtual void close_by_fault() = 0;

 protected:
  ~closable_connection() = default;
};

class connection_registry {
 public:
  using handle = std::list<closable_connection*>::iterator;

  handle add(closable_connection& connection) { return open_.insert(open_.end(), &connection); }
  void remove(handle h) { open_.erase(h); }

  void close_all() {
    for (auto* connection : open_) connection->close_by_fault();
  }

 private:
  std::list<closable_connection*> open_;  // stable handles, whatever else comes and goes
};

// Registers a connection for its lifetime.
class registration {
 public:
  registration(connection_registry& registry, closable_connection& connection)
      : registry_(registry), handle_(registry.add(connection)) {}
  registration(const registration&) = delete;
  registration& operator=(const registration&) = delete;
  ~registration() { registry_.remove(handle_); }

 private:
  connection_registry& registry_;
  connection_registry::handle handle_;
};

}  // namespace dplb::mock
