#include "dplb/support/io_buffers.hpp"

#include <boost/asio/detail/memory.hpp>
#include <boost/asio/detail/thread_context.hpp>
#include <boost/asio/detail/thread_info_base.hpp>

#include <array>
#include <atomic>
#include <cstring>
#include <new>

namespace dplb::io {

namespace {

// Counted only when malloc is called (never when a block is reused: off the steady path), and by
// tracked_bytes.
std::atomic<std::size_t> bytes_from_malloc{0};

void* allocate(std::size_t size) {
  void* memory = ::operator new(size);
  bytes_from_malloc.fetch_add(size, std::memory_order_relaxed);
  return memory;
}
void deallocate(void* memory, std::size_t size) noexcept {
  ::operator delete(memory);
  bytes_from_malloc.fetch_sub(size, std::memory_order_relaxed);
}

// Free blocks of one size, linked through their first bytes.
struct free_list {
  void* head = nullptr;
  std::size_t count = 0;

  void* pop() noexcept {
    void* block = head;
    if (block != nullptr) {
      std::memcpy(&head, block, sizeof(void*));
      --count;
    }
    return block;
  }
  void push(void* block) noexcept {
    std::memcpy(block, &head, sizeof(void*));
    head = block;
    ++count;
  }
  void free_all(std::size_t size) noexcept {
    while (void* block = pop()) deallocate(block, size);
  }
};

// Trivially destructible, so that it stays usable while the thread's other thread_local objects are
// destroyed (a block given back then is freed at once: `closed`).
struct thread_blocks {
  free_list small;
  free_list large;
  bool closed = false;

  free_list* list_for(std::size_t size) noexcept {
    if (closed) return nullptr;
    return size == small_block_size ? &small : size == large_block_size ? &large : nullptr;
  }
};
constinit thread_local thread_blocks blocks;

// Frees the thread's blocks when it ends. Made on a thread's first cached block (odr-used there).
struct free_at_thread_exit {
  ~free_at_thread_exit() {
    blocks.closed = true;
    blocks.small.free_all(small_block_size);
    blocks.large.free_all(large_block_size);
  }
};
thread_local free_at_thread_exit thread_exit;

}  // namespace

void* take_block(std::size_t size) {
  if (free_list* list = blocks.list_for(size)) {
    if (void* block = list->pop()) return block;
  }
  return allocate(size);
}

void give_block(void* block, std::size_t size) noexcept {
  free_list* list = blocks.list_for(size);
  if (list == nullptr || list->count >= max_cached_blocks) {
    deallocate(block, size);
    return;
  }
  if (list->count == 0) static_cast<void>(&thread_exit);  // the thread frees what it keeps when it ends
  list->push(block);
}

std::size_t buffer_bytes() noexcept { return bytes_from_malloc.load(std::memory_order_relaxed); }

void tracked_bytes::change(std::size_t from, std::size_t to) noexcept {
  bytes_from_malloc.fetch_add(to - from, std::memory_order_relaxed);  // modulo 2^64: a fall subtracts
}

void release_recycled_memory() {
  using boost::asio::detail::thread_info_base;
  thread_info_base* const this_thread = boost::asio::detail::thread_context::top_of_thread_call_stack();
  if (this_thread == nullptr) return;  // not on an event loop's thread: nothing is kept for it
  // Asio keeps blocks of up to 255 chunks of 4 bytes: 256 of each size at most with dplb's Asio override
  // (cmake/AsioOverride.cmake), a few slots without it. Taking that many of each size empties the cache
  // (what malloc supplies once it is empty is freed at once as well).
  constexpr std::size_t chunk = 4;
  constexpr std::size_t most_kept = 256;
  std::array<void*, most_kept> taken{};
  for (std::size_t chunks = 1; chunks <= 255; ++chunks) {
    for (void*& block : taken) block = thread_info_base::allocate(this_thread, chunks * chunk);
    for (void* block : taken) boost::asio::aligned_delete(block);
  }
}

std::size_t cached_blocks(std::size_t size) noexcept {
  const free_list* list = blocks.list_for(size);
  return list == nullptr ? 0 : list->count;
}

}  // namespace dplb::io
