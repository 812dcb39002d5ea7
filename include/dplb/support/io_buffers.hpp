#pragma once
// Memory for the proxy's I/O buffers, held only while bytes are in flight. A connection takes a buffer
// when a read or a relay needs one and gives it back as soon as it is empty, so that an idle keep-alive
// connection, or a stream waiting for its engine's next token, holds no large buffer
// (docs/operations.md, "Memory"). Taking and giving back happen a few times per request, so blocks of
// the two sizes the proxy reads in are kept per thread, each size in a bounded free list: a push or a
// pop, never malloc, in the steady state. A thread keeps at most max_cached_blocks of each size; the rest
// go back to malloc, so that the buffers of a surge do not stay with the thread after it.

#include <boost/beast/core/flat_buffer.hpp>

#include <cstddef>
#include <span>
#include <utility>

namespace dplb::io {

// What a stream waiting for its next event reads into: most SSE events, and most small responses, fit.
inline constexpr std::size_t small_block_size = 4 * 1024;
// A request head (with the body that came with it), a burst of SSE events, a large response's reads.
inline constexpr std::size_t large_block_size = 16 * 1024;
// Per thread and per block size: up to 512 KiB of large and 128 KiB of small blocks.
inline constexpr std::size_t max_cached_blocks = 32;

// `size` bytes: a block kept by this thread when `size` is a block size and one is free, else operator new.
void* take_block(std::size_t size);
// Gives back what take_block returned for the same `size`: kept for reuse, or freed past the bound.
void give_block(void* block, std::size_t size) noexcept;
// The blocks of `size` this thread keeps for reuse now.
std::size_t cached_blocks(std::size_t size) noexcept;
// Bytes of the sessions' buffers, all threads: taken from malloc through take_block and not freed yet
// (buffers in use and blocks kept for reuse), and request bodies held (tracked_bytes). When it falls to
// half its peak, connections have given a surge's memory back, and the memory trimmer returns the free
// pages to the system (app/memory_trimmer.hpp).
std::size_t buffer_bytes() noexcept;

// Gives back to malloc the handler and coroutine-frame memory that Asio keeps for reuse on the calling
// thread (an event loop's thread): after a surge those blocks are scattered over the heap, and each would
// keep a page from going back to the system. Costs a few milliseconds; the memory trimmer calls it on each
// worker once a surge is over.
void release_recycled_memory();

// Counts memory held outside the blocks (a request body's storage) in buffer_bytes(): set() after each
// change of the size held; the destructor counts it as freed.
class tracked_bytes {
 public:
  tracked_bytes() noexcept = default;
  ~tracked_bytes() { set(0); }
  tracked_bytes(const tracked_bytes&) = delete;
  tracked_bytes& operator=(const tracked_bytes&) = delete;

  void set(std::size_t bytes) noexcept {
    if (bytes != bytes_) change(bytes_, bytes);  // a steady connection's body keeps its size: no atomic
    bytes_ = bytes;
  }

 private:
  static void change(std::size_t from, std::size_t to) noexcept;
  std::size_t bytes_ = 0;
};

// Takes and gives back through take_block and give_block, so that the buffers using it share the blocks.
template <class T>
struct block_allocator {
  using value_type = T;
  block_allocator() noexcept = default;
  template <class U>
  block_allocator(const block_allocator<U>&) noexcept {}
  T* allocate(std::size_t n) { return static_cast<T*>(take_block(n * sizeof(T))); }
  void deallocate(T* p, std::size_t n) noexcept { give_block(p, n * sizeof(T)); }
  friend bool operator==(const block_allocator&, const block_allocator&) noexcept { return true; }
};

// A connection's read buffer: an empty one gives its block back with release_if_empty(), and the next
// prepare() of a block size takes one again.
using read_buffer = boost::beast::basic_flat_buffer<block_allocator<char>>;

// Gives the buffer's memory back when it holds no bytes (bytes not parsed yet stay where they are).
inline void release_if_empty(read_buffer& buffer) noexcept {
  if (buffer.size() == 0) buffer.shrink_to_fit();
}

// One block of a fixed size, taken when first used and given back by release() or the destructor.
class buffer_block {
 public:
  explicit buffer_block(std::size_t size) noexcept : size_(size) {}
  ~buffer_block() { release(); }
  buffer_block(const buffer_block&) = delete;
  buffer_block& operator=(const buffer_block&) = delete;

  std::span<char> get() {
    if (data_ == nullptr) data_ = static_cast<char*>(take_block(size_));
    return {data_, size_};
  }
  void release() noexcept {
    if (data_ != nullptr) give_block(std::exchange(data_, nullptr), size_);
  }
  bool held() const noexcept { return data_ != nullptr; }

 private:
  std::size_t size_;
  char* data_ = nullptr;
};

}  // namespace dplb::io
