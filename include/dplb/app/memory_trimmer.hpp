#pragma once
// Gives memory back to the system after a surge has ended. glibc's malloc keeps freed chunks in its
// heaps unless they sit at the very top, so after 10,000 streams close, dplb's RSS stays near its peak
// (measured: 304 MiB held, 238 MiB still resident after every stream had closed). malloc_trim(0) returns
// the free pages. It briefly locks each malloc arena, so it runs only when a surge is over, never under
// steady load: when the open client connections, or the memory of I/O buffers taken from malloc
// (io::buffer_bytes(): idle keep-alive connections give theirs back without closing), have fallen to half
// their peak since the last trim.
//
// A trim can only return whole free pages. What stays after a surge must therefore not be scattered over
// the heap: Asio's per-socket reactor states, which it never frees, are kept in dense slabs
// (support/reactor_memory.hpp); the sessions' buffers go back to malloc, beyond a small per-thread cache
// (support/io_buffers.hpp).

#include <algorithm>
#include <cstddef>

namespace dplb::app {

class memory_trimmer {
 public:
  // Surges smaller than these are not worth a trim (each connection holds some 5-15 KiB).
  static constexpr std::size_t min_peak = 256;                        // connections
  static constexpr std::size_t min_buffer_peak = 4 * 1024 * 1024;     // bytes of I/O buffers

  // Called periodically with the open client connections and the bytes of I/O buffers taken from malloc;
  // true when a trim is due now.
  bool observe(std::size_t open_connections, std::size_t buffer_bytes = 0) noexcept {
    peak_ = std::max(peak_, open_connections);
    buffer_peak_ = std::max(buffer_peak_, buffer_bytes);
    const bool connections_fell = peak_ >= min_peak && open_connections * 2 <= peak_;
    const bool buffers_fell = buffer_peak_ >= min_buffer_peak && buffer_bytes * 2 <= buffer_peak_;
    if (!connections_fell && !buffers_fell) return false;
    peak_ = open_connections;  // the next trim needs a new surge
    buffer_peak_ = buffer_bytes;
    return true;
  }

 private:
  std::size_t peak_ = 0;
  std::size_t buffer_peak_ = 0;
};

}  // namespace dplb::app
