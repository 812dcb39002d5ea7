#pragma once
// Where Asio's epoll reactor keeps the state of each socket it watches. Asio makes one such state (some
// 170 bytes) for every socket the first time that many are open at once, and never frees it: it goes to
// a free list for the next socket. Allocated one by one among the sessions' own memory, the states of a
// surge of 10,000 connections were scattered over the heap, one or two on every few pages, and after
// the surge those pages could not be given back however much around them was free (measured: 92 MiB
// resident after 10,000 streams had closed, against 9 MiB before them). dplb gives Asio dense storage
// for them instead (src/support/reactor_memory.hpp, compiled with Asio): slabs of 256 states, side by
// side, so that what a surge leaves behind is a few contiguous megabytes, and everything between them
// can go back to the system.

#include <cstddef>

namespace dplb::io {

// The reactor states made in dplb's slabs so far (each is reused by Asio, never freed): a check that
// the storage is in use with the Asio that dplb is built on.
std::size_t reactor_states_made() noexcept;

}  // namespace dplb::io
