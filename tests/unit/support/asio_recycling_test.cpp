// The recycling of handler and coroutine-frame memory (cmake/AsioOverride.cmake, change 2): freed
// blocks are kept per size, a bounded number per size, and handed back to a request of the same size.
// On Asio as installed (the override off, or not matching this Boost) the blocks must still be sound;
// that every one is recycled is the override's alone, and is reported as skipped there.
#include <catch2/catch.hpp>

#include <boost/asio/detail/thread_info_base.hpp>

#include "dplb/support/asio_override_check.hpp"  // with the override, stops the build on Boost's own copy

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <set>
#include <vector>

using boost::asio::detail::thread_info_base;

namespace {

using frame_tag = thread_info_base::awaitable_frame_tag;

void* take(thread_info_base& info, std::size_t size, std::size_t align = alignof(std::max_align_t)) {
  return thread_info_base::allocate(frame_tag(), &info, size, align);
}
void give_back(thread_info_base& info, void* block, std::size_t size) {
  thread_info_base::deallocate(frame_tag(), &info, block, size);
}

}  // namespace

TEST_CASE("a freed frame comes back to the next request of its size, whatever else was freed", "[asio]") {
  thread_info_base info;
  // A request's frames, of several sizes, all alive at once, for many requests at once: more blocks
  // than Asio's slot cache holds.
  const std::vector<std::size_t> sizes{240, 704, 960, 992};
  constexpr int in_flight = 64;
  std::vector<std::pair<void*, std::size_t>> taken;
  for (int r = 0; r < in_flight; ++r) {
    for (auto size : sizes) taken.emplace_back(take(info, size), size);
  }
  std::set<void*> freed;
  for (auto [block, size] : taken) {
    std::memset(block, 0xab, size);  // the block is the caller's to write, all of it
    give_back(info, block, size);
    freed.insert(block);
  }
  // The same load again: every block comes from those freed, none from malloc.
  std::vector<std::pair<void*, std::size_t>> again;
  again.reserve(taken.size());
  int recycled = 0;
  for (int r = 0; r < in_flight; ++r) {
    for (auto size : sizes) {
      void* block = take(info, size);
      recycled += freed.count(block) ? 1 : 0;
      again.emplace_back(block, size);
    }
  }
  std::set<void*> handed_out;
  for (const auto& entry : again) handed_out.insert(entry.first);
  CHECK(handed_out.size() == again.size());  // no block handed out twice
#if defined(DPLB_ASIO_OVERRIDE)
  CHECK(recycled == in_flight * static_cast<int>(sizes.size()));
#else
  WARN("skipped: every block recycled (" << recycled << " of " << again.size()
       << " were here) needs the Asio override (cmake/AsioOverride.cmake); this build uses Asio as installed");
#endif
  for (auto [block, size] : again) give_back(info, block, size);
}

TEST_CASE("recycled blocks keep the alignment asked for, and a size's list is bounded", "[asio]") {
  thread_info_base info;
  void* small = take(info, 100);
  give_back(info, small, 100);
  // A stricter alignment than the freed block has is never served from it.
  void* aligned = take(info, 100, 64);
  CHECK(reinterpret_cast<std::uintptr_t>(aligned) % 64 == 0);
  give_back(info, aligned, 100);

  // Far more blocks of one size than a list keeps: all are given back (ASan reports any leak), and
  // taking them again works.
  std::vector<void*> many;
  for (int i = 0; i < 1000; ++i) many.push_back(take(info, 500));
  for (void* block : many) give_back(info, block, 500);
  many.clear();
  for (int i = 0; i < 1000; ++i) many.push_back(take(info, 500));
  CHECK(std::set<void*>(many.begin(), many.end()).size() == many.size());  // no block handed out twice
  for (void* block : many) give_back(info, block, 500);
}

TEST_CASE("the Asio compiled into dplb's library is the one these tests were compiled against", "[asio]") {
  // The headers here carry DPLB_ASIO_OVERRIDE exactly when dplb_asio was compiled with it: a test that
  // links a library built on the other Asio would check a recycling that is not the one dplb runs.
#if defined(DPLB_ASIO_OVERRIDE)
  CHECK(dplb::support::asio_override_compiled());
#else
  CHECK_FALSE(dplb::support::asio_override_compiled());
#endif
}
