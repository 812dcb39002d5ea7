// The buffer policy behind dplb's memory bounds (docs/operations.md, "Memory"): a connection's read buffer
// gives its block back once empty, the blocks are reused per thread without malloc, and a thread keeps
// only a bounded number of them.

#include <catch2/catch.hpp>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>

#include <cstring>
#include <vector>

#include "dplb/support/io_buffers.hpp"
#include "dplb/support/reactor_memory.hpp"

using namespace dplb;

TEST_CASE("an emptied read buffer gives its block back, and the next read takes it again", "[support][memory]") {
  io::read_buffer buffer;
  auto space = buffer.prepare(io::large_block_size);
  REQUIRE(buffer.capacity() == io::large_block_size);
  const void* block = space.data();
  std::memcpy(space.data(), "GET / HTTP/1.1\r\n\r\n", 18);
  buffer.commit(18);

  io::release_if_empty(buffer);  // bytes not parsed yet stay where they are
  CHECK(buffer.capacity() == io::large_block_size);
  CHECK(buffer.size() == 18);

  buffer.consume(18);
  const auto cached = io::cached_blocks(io::large_block_size);
  io::release_if_empty(buffer);
  CHECK(buffer.capacity() == 0);
  CHECK(io::cached_blocks(io::large_block_size) == cached + 1);

  // The block comes back from the thread's list, not from malloc.
  CHECK(buffer.prepare(io::large_block_size).data() == block);
  CHECK(io::cached_blocks(io::large_block_size) == cached);
}

TEST_CASE("a thread keeps a bounded number of free blocks of each size", "[support][memory]") {
  std::vector<void*> taken;
  for (std::size_t i = 0; i < 3 * io::max_cached_blocks; ++i) taken.push_back(io::take_block(io::small_block_size));
  for (void* block : taken) io::give_block(block, io::small_block_size);
  CHECK(io::cached_blocks(io::small_block_size) == io::max_cached_blocks);

  // Other sizes are plain allocations, never kept.
  void* odd = io::take_block(1000);
  io::give_block(odd, 1000);
  CHECK(io::cached_blocks(1000) == 0);
}

TEST_CASE("a buffer block is taken when first used and given back when released", "[support][memory]") {
  io::buffer_block block(io::large_block_size);
  CHECK_FALSE(block.held());
  const auto span = block.get();
  CHECK(span.size() == io::large_block_size);
  CHECK(block.held());
  CHECK(block.get().data() == span.data());  // the same block until released
  const auto cached = io::cached_blocks(io::large_block_size);
  block.release();
  CHECK_FALSE(block.held());
  CHECK(io::cached_blocks(io::large_block_size) == cached + 1);
}

TEST_CASE("Asio's reactor keeps its per-socket states in dplb's dense slabs", "[support][memory]") {
  // A state is made only when more sockets are open at once than ever before in the process (they are
  // reused after that): 600 at once need at least 600.
  boost::asio::io_context context;
  std::vector<boost::asio::ip::tcp::socket> sockets;
  for (int i = 0; i < 600; ++i) sockets.emplace_back(context, boost::asio::ip::tcp::v4());
  CHECK(io::reactor_states_made() >= 600);
}
