#include <catch2/catch.hpp>

#include "dplb/app/memory_trimmer.hpp"

using dplb::app::memory_trimmer;

TEST_CASE("memory is trimmed once after a surge ends, never under steady load", "[app]") {
  memory_trimmer t;
  for (int i = 0; i < 100; ++i) CHECK_FALSE(t.observe(5'000));  // steady: however many, no trim
  CHECK_FALSE(t.observe(2'501));                                  // not yet half the peak
  CHECK(t.observe(2'500));                                        // the surge is over: trim
  CHECK_FALSE(t.observe(2'500));                                  // and only once
  CHECK_FALSE(t.observe(1'500));                                  // falling further, not yet by half again
  CHECK(t.observe(1'250));                                        // half of 2,500: trim again
}

TEST_CASE("small surges are not worth a trim", "[app]") {
  memory_trimmer t;
  CHECK_FALSE(t.observe(memory_trimmer::min_peak - 1));
  CHECK_FALSE(t.observe(0));
  CHECK_FALSE(t.observe(memory_trimmer::min_peak));
  CHECK(t.observe(0));
}

TEST_CASE("memory is trimmed once idle connections have given a surge's buffers back", "[app]") {
  // Connections stay open (idle keep-alive) while their buffers go back to malloc.
  memory_trimmer t;
  constexpr std::size_t mib = 1024 * 1024;
  for (int i = 0; i < 10; ++i) CHECK_FALSE(t.observe(300, 40 * mib));  // steady: no trim
  CHECK_FALSE(t.observe(300, 21 * mib));                                // not yet half
  CHECK(t.observe(300, 20 * mib));                                      // half the peak: trim
  CHECK_FALSE(t.observe(300, 12 * mib));                                // once per fall by half
  CHECK(t.observe(300, 10 * mib));

  memory_trimmer small;
  CHECK_FALSE(small.observe(300, memory_trimmer::min_buffer_peak - 1));
  CHECK_FALSE(small.observe(300, 0));  // a fall from below the smallest peak worth a trim
}
