#pragma once
// A small msgpack writer (https://github.com/msgpack/msgpack/blob/master/spec.md) for the KV-cache events
// the mock publishes: each value in its smallest encoding, as msgspec (vLLM's encoder) writes it. Only
// what the events need: nil, bool, integers, float64, str, bin, and array and map headers (the caller
// writes the items after a header). Appends to a std::string, the payload frame as it is sent.
// libmsgpack-cxx cannot be used: Debian's package drags in an older Boost than the one dplb builds with.

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace dplb::mock {

class msgpack_writer {
 public:
  explicit msgpack_writer(std::string& out) : out_(out) {}

  msgpack_writer& nil() { return byte(0xc0); }
  msgpack_writer& boolean(bool v) { return byte(v ? 0xc3 : 0xc2); }

  // Non-negative integers: positive fixint, then uint 8/16/32/64.
  msgpack_writer& uint(std::uint64_t v) {
    if (v <= 0x7f) return byte(static_cast<std::uint8_t>(v));
    if (v <= 0xff) return byte(0xcc).big_endian(v, 1);
    if (v <= 0xffff) return byte(0xcd).big_endian(v, 2);
    if (v <= 0xffffffffULL) return byte(0xce).big_endian(v, 4);
    return byte(0xcf).big_endian(v, 8);
  }

  // Signed integers: a non-negative one as uint() (msgspec does the same), a negative one as negative
  // fixint, then int 8/16/32/64.
  msgpack_writer& integer(std::int64_t v) {
    if (v >= 0) return uint(static_cast<std::uint64_t>(v));
    const auto bits = static_cast<std::uint64_t>(v);
    if (v >= -32) return byte(static_cast<std::uint8_t>(bits));
    if (v >= INT8_MIN) return byte(0xd0).big_endian(bits, 1);
    if (v >= INT16_MIN) return byte(0xd1).big_endian(bits, 2);
    if (v >= INT32_MIN) return byte(0xd2).big_endian(bits, 4);
    return byte(0xd3).big_endian(bits, 8);
  }

  // Python floats are doubles, and msgspec always writes them as float 64.
  msgpack_writer& float64(double v) {
    std::uint64_t bits = 0;
    std::memcpy(&bits, &v, sizeof bits);
    return byte(0xcb).big_endian(bits, 8);
  }

  msgpack_writer& str(std::string_view s) {
    if (s.size() <= 31) byte(static_cast<std::uint8_t>(0xa0 | s.size()));
    else if (s.size() <= 0xff) byte(0xd9).big_endian(s.size(), 1);
    else if (s.size() <= 0xffff) byte(0xda).big_endian(s.size(), 2);
    else byte(0xdb).big_endian(s.size(), 4);
    out_.append(s);
    return *this;
  }

  msgpack_writer& bin(std::string_view bytes) {
    if (bytes.size() <= 0xff) byte(0xc4).big_endian(bytes.size(), 1);
    else if (bytes.size() <= 0xffff) byte(0xc5).big_endian(bytes.size(), 2);
    else byte(0xc6).big_endian(bytes.size(), 4);
    out_.append(bytes);
    return *this;
  }

  // Headers: `n` items (a map: `n` key/value pairs) follow.
  msgpack_writer& array(std::uint32_t n) {
    if (n <= 15) return byte(static_cast<std::uint8_t>(0x90 | n));
    if (n <= 0xffff) return byte(0xdc).big_endian(n, 2);
    return byte(0xdd).big_endian(n, 4);
  }
  msgpack_writer& map(std::uint32_t n) {
    if (n <= 15) return byte(static_cast<std::uint8_t>(0x80 | n));
    if (n <= 0xffff) return byte(0xde).big_endian(n, 2);
    return byte(0xdf).big_endian(n, 4);
  }

 private:
  msgpack_writer& byte(std::uint8_t b) {
    out_.push_back(static_cast<char>(b));
    return *this;
  }
  msgpack_writer& big_endian(std::uint64_t v, int width) {
    for (int i = width - 1; i >= 0; --i) out_.push_back(static_cast<char>(static_cast<std::uint8_t>(v >> (8 * i))));
    return *this;
  }

  std::string& out_;
};

}  // namespace dplb::mock
