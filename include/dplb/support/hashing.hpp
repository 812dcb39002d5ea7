#pragma once
// The two small hashes dplb's routing state uses, in one place. Neither is a defence against an
// adversary: the prefix index and the affinity ring only need equal inputs to hash equal and different
// ones almost never to, and a collision costs one misplaced request, never a wrong answer. Both are
// fixed functions (no per-process seed), so that dplb replicas agree on where a session or a prefix goes.

#include <cstdint>
#include <string_view>

namespace dplb::support {

// splitmix64's finaliser: a cheap, well-mixed 64-bit permutation.
constexpr std::uint64_t mix64(std::uint64_t x) noexcept {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// FNV-1a 64 of the bytes, then mixed (FNV's low bits alone spread poorly over a ring).
constexpr std::uint64_t hash_bytes(std::string_view bytes) noexcept {
  std::uint64_t h = 0xcbf29ce484222325ULL;
  for (const char c : bytes) h = (h ^ static_cast<unsigned char>(c)) * 0x100000001b3ULL;
  return mix64(h);
}

}  // namespace dplb::support
