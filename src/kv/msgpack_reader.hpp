#pragma once
// A bounded, allocation-free msgpack reader over bytes in memory, for the KV-cache event decoder. It reads
// one item's header at a time and never trusts a declared size: a str, bin or ext longer than the bytes
// left is an error, and so is an array or map declaring more items than bytes left (every item takes at
// least one byte), so no count read from the wire can make a caller reserve beyond the payload. Skipping
// an item is iterative (a count of items still to skip), so nesting depth costs no stack.
// Format: https://github.com/msgpack/msgpack/blob/master/spec.md (big-endian numbers throughout).

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string_view>

namespace dplb::kv::msgpack {

enum class kind : std::uint8_t { nil, boolean, integer, floating, str, bin, array, map, ext };

struct item {
  kind type = kind::nil;
  bool flag = false;                // boolean
  bool negative = false;            // integer: read from a signed encoding with a negative value
  std::uint64_t u = 0;              // integer: the value's 64-bit pattern (two's complement when negative)
  double f = 0;                     // floating (float 32 widened)
  std::uint32_t count = 0;          // array: items; map: pairs; str/bin/ext: bytes
  std::int8_t ext_type = 0;         // ext
  std::span<const std::byte> data;  // str, bin, ext: the bytes, in place

  std::string_view text() const { return {reinterpret_cast<const char*>(data.data()), data.size()}; }
  std::int64_t as_int64() const { return static_cast<std::int64_t>(u); }
  // An integer that fits `int64_t` as a value (a uint64 above INT64_MAX does not).
  bool fits_int64() const { return type == kind::integer && (negative || u <= INT64_MAX); }
};

class reader {
 public:
  explicit reader(std::span<const std::byte> bytes) : bytes_(bytes) {}

  std::size_t position() const { return pos_; }
  void seek(std::size_t pos) { pos_ = pos; }
  std::size_t remaining() const { return bytes_.size() - pos_; }
  bool at_end() const { return pos_ == bytes_.size(); }
  // The bytes from `from` to the current position (an item just read or skipped, whole).
  std::span<const std::byte> since(std::size_t from) const { return bytes_.subspan(from, pos_ - from); }

  // Reads one item's header (and a str/bin/ext's bytes, in place). False on truncation, on a reserved byte
  // (0xc1), or on an array/map declaring more items than bytes left; the position is then unspecified.
  bool next(item& out) {
    std::uint8_t b = 0;
    if (!byte(b)) return false;
    if (b <= 0x7f) return integer(out, b, false);
    if (b >= 0xe0) return integer(out, static_cast<std::uint64_t>(static_cast<std::int64_t>(static_cast<std::int8_t>(b))), true);
    if (b >= 0x80 && b <= 0x8f) return container(out, kind::map, b & 0x0fu);
    if (b >= 0x90 && b <= 0x9f) return container(out, kind::array, b & 0x0fu);
    if (b >= 0xa0 && b <= 0xbf) return blob(out, kind::str, b & 0x1fu);
    std::uint64_t n = 0;
    switch (b) {
      case 0xc0: out = item{}; return true;
      case 0xc2: case 0xc3: out = item{}; out.type = kind::boolean; out.flag = b == 0xc3; return true;
      case 0xc4: return be(1, n) && blob(out, kind::bin, n);
      case 0xc5: return be(2, n) && blob(out, kind::bin, n);
      case 0xc6: return be(4, n) && blob(out, kind::bin, n);
      case 0xc7: return be(1, n) && ext(out, n);
      case 0xc8: return be(2, n) && ext(out, n);
      case 0xc9: return be(4, n) && ext(out, n);
      case 0xca: {
        if (!be(4, n)) return false;
        float f = 0;
        const auto bits = static_cast<std::uint32_t>(n);
        std::memcpy(&f, &bits, sizeof f);
        out = item{};
        out.type = kind::floating;
        out.f = f;
        return true;
      }
      case 0xcb: {
        if (!be(8, n)) return false;
        out = item{};
        out.type = kind::floating;
        std::memcpy(&out.f, &n, sizeof out.f);
        return true;
      }
      case 0xcc: return be(1, n) && integer(out, n, false);
      case 0xcd: return be(2, n) && integer(out, n, false);
      case 0xce: return be(4, n) && integer(out, n, false);
      case 0xcf: return be(8, n) && integer(out, n, false);
      case 0xd0: return be(1, n) && signed_integer(out, static_cast<std::int8_t>(n));
      case 0xd1: return be(2, n) && signed_integer(out, static_cast<std::int16_t>(n));
      case 0xd2: return be(4, n) && signed_integer(out, static_cast<std::int32_t>(n));
      case 0xd3: return be(8, n) && signed_integer(out, static_cast<std::int64_t>(n));
      case 0xd4: return ext(out, 1);
      case 0xd5: return ext(out, 2);
      case 0xd6: return ext(out, 4);
      case 0xd7: return ext(out, 8);
      case 0xd8: return ext(out, 16);
      case 0xd9: return be(1, n) && blob(out, kind::str, n);
      case 0xda: return be(2, n) && blob(out, kind::str, n);
      case 0xdb: return be(4, n) && blob(out, kind::str, n);
      case 0xdc: return be(2, n) && container(out, kind::array, n);
      case 0xdd: return be(4, n) && container(out, kind::array, n);
      case 0xde: return be(2, n) && container(out, kind::map, n);
      case 0xdf: return be(4, n) && container(out, kind::map, n);
      default: return false;  // 0xc1: never used
    }
  }

  // Skips `items` whole items (their nested items included).
  bool skip(std::uint64_t items = 1) {
    item it;
    while (items > 0) {
      if (!next(it)) return false;
      --items;
      // Counts were checked against the bytes left, so this sum stays far below 2^64.
      if (it.type == kind::array) items += it.count;
      if (it.type == kind::map) items += 2ull * it.count;
    }
    return true;
  }

 private:
  bool byte(std::uint8_t& b) {
    if (pos_ >= bytes_.size()) return false;
    b = static_cast<std::uint8_t>(bytes_[pos_++]);
    return true;
  }
  bool be(std::size_t width, std::uint64_t& n) {
    if (remaining() < width) return false;
    n = 0;
    for (std::size_t i = 0; i < width; ++i) n = (n << 8) | static_cast<std::uint8_t>(bytes_[pos_ + i]);
    pos_ += width;
    return true;
  }
  static bool integer(item& out, std::uint64_t u, bool negative) {
    out = item{};
    out.type = kind::integer;
    out.u = u;
    out.negative = negative;
    return true;
  }
  static bool signed_integer(item& out, std::int64_t v) { return integer(out, static_cast<std::uint64_t>(v), v < 0); }
  bool container(item& out, kind k, std::uint64_t n) {
    // Each item takes at least one byte (a map pair two): more declared than bytes left is a lie.
    if (n > remaining() / (k == kind::map ? 2 : 1)) return false;
    out = item{};
    out.type = k;
    out.count = static_cast<std::uint32_t>(n);
    return true;
  }
  bool blob(item& out, kind k, std::uint64_t n) {
    if (n > remaining()) return false;
    out = item{};
    out.type = k;
    out.count = static_cast<std::uint32_t>(n);
    out.data = bytes_.subspan(pos_, n);
    pos_ += n;
    return true;
  }
  bool ext(item& out, std::uint64_t n) {
    std::uint64_t type = 0;
    if (!be(1, type) || !blob(out, kind::ext, n)) return false;
    out.ext_type = static_cast<std::int8_t>(type);
    return true;
  }

  std::span<const std::byte> bytes_;
  std::size_t pos_ = 0;
};

}  // namespace dplb::kv::msgpack
