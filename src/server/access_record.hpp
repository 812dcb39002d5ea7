#pragma once
// Private to the session: the access log entry (--access-log) of the request being served. It opens when a
// request's head is read (or when dplb answers a request it could not read), collects what the accounting
// and the relay learn, and is written once the response is out.

#include <chrono>
#include <cstddef>
#include <string>
#include <string_view>

#include "dplb/metrics/access_log.hpp"

namespace dplb::server {

class access_record {
 public:
  using clock_type = std::chrono::steady_clock;

  // `client`: "address:port", the same for every request of the connection.
  void set_client(std::string client) { client_ = std::move(client); }

  bool is_open() const noexcept { return open_; }
  metrics::access_entry& entry() noexcept { return entry_; }
  // The entry to fill while one is open, else null (the accounting's view of it).
  metrics::access_entry* open_entry() noexcept { return open_ ? &entry_ : nullptr; }

  void begin(std::string_view method, std::string_view target) {
    entry_ = metrics::access_entry{};
    entry_.time = std::chrono::system_clock::now();
    entry_.started = clock_type::now();
    entry_.method = method;
    entry_.path = target;
    entry_.client = client_;
    open_ = true;
  }

  // dplb answered (or, for 408 and 499, gave up on) the request itself: unless a rank's accounting already
  // set them, these are the status and body size the client got.
  void answered_by_dplb(unsigned status, std::size_t body_bytes) {
    if (!open_) begin({}, {});  // a request too malformed to have a method and a path
    if (!entry_.rank) entry_.status = status;  // else the accounting has it (an error sent for a rank)
    entry_.bytes = body_bytes;
  }

  // dplb's own paths are for its operators' tools, not traffic: they are not logged.
  void drop() noexcept { open_ = false; }

  // Writes the open entry and closes it.
  void write_to(metrics::access_log& log) {
    open_ = false;
    if (entry_.status == 0) entry_.status = 499;  // the client left before any answer
    log.write(metrics::format_access_line(entry_, clock_type::now()));
  }

  // An idle connection gives back what the last entry held (unless one is still open).
  void release_if_closed() {
    if (!open_) entry_ = {};
  }

 private:
  metrics::access_entry entry_;  // the request being served, while open_
  bool open_ = false;
  std::string client_;
};

}  // namespace dplb::server
