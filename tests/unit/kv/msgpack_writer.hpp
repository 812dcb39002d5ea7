#pragma once
// A small msgpack writer for the KV-event tests: the smallest encoding of each value, as msgspec (vLLM's
// encoder) and Python's msgpack write it. event_decoder_test.cpp checks its bytes against ones Python's
// msgpack wrote, so the decoder is tested against the real format, not against this writer's idea of it.
// Also raw() for hand-made garbage.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string_view>
#include <vector>

namespace dplb::kv::test {

class msgpack_writer {
 public:
  msgpack_writer& nil() { return byte(0xc0); }
  msgpack_writer& boolean(bool v) { return byte(v ? 0xc3 : 0xc2); }
  msgpack_writer& uint(std::uint64_t v) {
    if (v <= 0x7f) return byte(static_cast<std::uint8_t>(v));
    if (v <= 0xff) return byte(0xcc).be(v, 1);
    if (v <= 0xffff) return byte(0xcd).be(v, 2);
    if (v <= 0xffffffffULL) return byte(0xce).be(v, 4);
    return byte(0xcf).be(v, 8);
  }
  msgpack_writer& integer(std::int64_t v) {
    if (v >= 0) return uint(static_cast<std::uint64_t>(v));
    if (v >= -32) return byte(static_cast<std::uint8_t>(static_cast<std::int8_t>(v)));
    if (v >= INT8_MIN) return byte(0xd0).be(static_cast<std::uint64_t>(v), 1);
    if (v >= INT16_MIN) return byte(0xd1).be(static_cast<std::uint64_t>(v), 2);
    if (v >= INT32_MIN) return byte(0xd2).be(static_cast<std::uint64_t>(v), 4);
    return byte(0xd3).be(static_cast<std::uint64_t>(v), 8);
  }
  msgpack_writer& float64(double v) {
    std::uint64_t bits = 0;
    std::memcpy(&bits, &v, sizeof bits);
    return byte(0xcb).be(bits, 8);
  }
  msgpack_writer& str(std::string_view s) {
    if (s.size() <= 31) byte(static_cast<std::uint8_t>(0xa0 | s.size()));
    else if (s.size() <= 0xff) byte(0xd9).be(s.size(), 1);
    else if (s.size() <= 0xffff) byte(0xda).be(s.size(), 2);
    else byte(0xdb).be(s.size(), 4);
    return raw(s);
  }
  msgpack_writer& bin(std::string_view s) {
    if (s.size() <= 0xff) byte(0xc4).be(s.size(), 1);
    else if (s.size() <= 0xffff) byte(0xc5).be(s.size(), 2);
    else byte(0xc6).be(s.size(), 4);
    return raw(s);
  }
  msgpack_writer& array(std::uint32_t n) {
    if (n <= 15) return byte(static_cast<std::uint8_t>(0x90 | n));
    if (n <= 0xffff) return byte(0xdc).be(n, 2);
    return byte(0xdd).be(n, 4);
  }
  msgpack_writer& map(std::uint32_t n) {
    if (n <= 15) return byte(static_cast<std::uint8_t>(0x80 | n));
    if (n <= 0xffff) return byte(0xde).be(n, 2);
    return byte(0xdf).be(n, 4);
  }
  template <class Ints>
  msgpack_writer& uints(const Ints& values) {
    array(static_cast<std::uint32_t>(values.size()));
    for (const auto v : values) uint(static_cast<std::uint64_t>(v));
    return *this;
  }
  msgpack_writer& raw(std::string_view bytes) {
    for (const char c : bytes) out_.push_back(static_cast<std::byte>(c));
    return *this;
  }
  msgpack_writer& byte(std::uint8_t b) {
    out_.push_back(static_cast<std::byte>(b));
    return *this;
  }
  msgpack_writer& be(std::uint64_t v, int width) {
    for (int i = width - 1; i >= 0; --i) byte(static_cast<std::uint8_t>(v >> (8 * i)));
    return *this;
  }

  std::span<const std::byte> bytes() const { return out_; }
  std::vector<std::byte> take() { return std::move(out_); }

 private:
  std::vector<std::byte> out_;
};

}  // namespace dplb::kv::test
