#pragma once
// Private to request_facts.cpp: a validating JSON reader (RFC 8259) that reports what it reads to a
// handler as events, builds nothing, and keeps a string only when it has escapes to decode. It exists
// because request bodies are read on the request path: nlohmann's SAX parser, which accepts the same
// texts, took ~20 us for a 4 KiB completions body (it copies every string byte by byte through its
// lexer), this ~1 us. The fuzz target fuzz_request_facts checks the two against each other.
//
// What it accepts is what nlohmann::json::parse accepts: a UTF-8 byte order mark first, RFC 3629 UTF-8
// only (no overlong forms, no encoded surrogates), \u escapes with surrogate pairs (a lone surrogate is
// an error), no raw control characters in strings, numbers by the JSON grammar, nothing after the value
// but whitespace. One difference: a number beyond a double's range (`1e400`) is valid here, as in
// RFC 8259 and in Python's json, which vLLM reads bodies with; nlohmann refuses it. Nesting is
// unbounded and costs one bit per level on the heap, never stack.
//
// The handler's events (each returns false to stop, which fails the read):
//   start_object() end_object() start_array() end_array() key(std::string_view)
//   string(std::string_view)  - decoded; the view lives until the next event
//   integer(bool negative, std::uint64_t magnitude) - magnitude saturated at UINT64_MAX; -0 is not negative
//   fraction()                - a number with a fraction or an exponent
//   literal()                 - true, false or null

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace dplb::server::json {

class reader {
 public:
  explicit reader(std::string_view text) : p_(text.data()), end_(text.data() + text.size()) {}

  // Reads the whole text as one JSON value; false when it is not one or the handler stopped.
  template <typename Handler>
  bool read(Handler& h);

 private:
  template <typename Handler>
  bool read_scalar(Handler& h);
  template <typename Handler>
  bool read_key(Handler& h);
  template <typename Handler>
  bool read_number(Handler& h);
  template <typename Handler>
  bool close_or_next(Handler& h, bool& next);
  std::optional<std::string_view> read_string();
  bool append_escape();
  std::optional<std::uint32_t> read_hex4();
  bool read_literal(std::string_view word);
  std::size_t utf8_length_here() const;
  void skip_whitespace();

  const char* p_;
  const char* const end_;
  // One bit per open container, true for an array. The first 64 levels live in a word, so that a request
  // body (a few levels deep) is read without allocating; deeper nesting goes on the heap.
  class nesting_stack {
   public:
    void push(bool array) {
      if (depth_ < 64) shallow_ = array ? shallow_ | (std::uint64_t{1} << depth_) : shallow_ & ~(std::uint64_t{1} << depth_);
      else deep_.push_back(array);
      ++depth_;
    }
    bool back() const { return depth_ <= 64 ? (shallow_ >> (depth_ - 1)) & 1 : deep_.back(); }
    void pop() {
      if (depth_ > 64) deep_.pop_back();
      --depth_;
    }
    bool empty() const { return depth_ == 0; }

   private:
    std::size_t depth_ = 0;
    std::uint64_t shallow_ = 0;
    std::vector<bool> deep_;
  };
  nesting_stack nesting_;
  std::string decoded_;        // the current string, when it had escapes
};

namespace detail {

constexpr std::uint64_t ones = 0x0101010101010101ull;
constexpr std::uint64_t highs = 0x8080808080808080ull;

// Whether any of 8 bytes needs a look in a string: a quote, a backslash, a control character or a
// non-ASCII byte. (v - ones*n) & ~v & highs is non-zero exactly when some byte of v is below n.
inline bool special_in(std::uint64_t v) {
  const auto below = [](std::uint64_t w, std::uint64_t n) { return (w - ones * n) & ~w & highs; };
  const std::uint64_t quote = v ^ (ones * '"'), backslash = v ^ (ones * '\\');  // zero bytes where they are
  return (below(v, 0x20) | below(quote, 1) | below(backslash, 1) | (v & highs)) != 0;
}

// The length of the valid UTF-8 sequence that starts at p with a byte >= 0x80, 0 when it is not one
// (RFC 3629 table 3-7).
inline std::size_t utf8_length(const unsigned char* p, const unsigned char* end) {
  const auto in = [&](std::size_t i, unsigned lo, unsigned hi) { return p + i < end && p[i] >= lo && p[i] <= hi; };
  const unsigned c = p[0];
  if (c >= 0xC2 && c <= 0xDF) return in(1, 0x80, 0xBF) ? 2 : 0;
  if (c >= 0xE0 && c <= 0xEF) {
    const unsigned lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
    return in(1, lo, hi) && in(2, 0x80, 0xBF) ? 3 : 0;
  }
  if (c >= 0xF0 && c <= 0xF4) {
    const unsigned lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
    return in(1, lo, hi) && in(2, 0x80, 0xBF) && in(3, 0x80, 0xBF) ? 4 : 0;
  }
  return 0;
}

inline void append_utf8(std::string& out, std::uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

}  // namespace detail

template <typename Handler>
bool reader::read(Handler& h) {
  if (end_ - p_ >= 3 && std::memcmp(p_, "\xEF\xBB\xBF", 3) == 0) p_ += 3;
  for (;;) {
    // A value: a scalar, or the opening of a container (whose first value, if any, is read next turn).
    skip_whitespace();
    if (p_ == end_) return false;
    if (*p_ == '{' || *p_ == '[') {
      const bool array = *p_++ == '[';
      if (!(array ? h.start_array() : h.start_object())) return false;
      nesting_.push(array);
      skip_whitespace();
      if (p_ == end_) return false;
      if (*p_ != (array ? ']' : '}')) {
        if (!array && !read_key(h)) return false;
        continue;
      }
    } else if (!read_scalar(h)) {
      return false;
    }
    bool next = false;
    if (!close_or_next(h, next)) return false;
    if (!next) return true;
  }
}

// After a value: closes the containers that end here, then either moves to the next value of the
// innermost one (next = true, its key read) or, once the top-level value is complete, checks that
// nothing but whitespace follows.
template <typename Handler>
bool reader::close_or_next(Handler& h, bool& next) {
  for (;;) {
    skip_whitespace();
    if (nesting_.empty()) return p_ == end_;
    if (p_ == end_) return false;
    const bool array = nesting_.back();
    if (*p_ == (array ? ']' : '}')) {
      ++p_;
      nesting_.pop();
      if (!(array ? h.end_array() : h.end_object())) return false;
      continue;
    }
    if (*p_++ != ',') return false;
    next = true;
    if (array) return true;
    skip_whitespace();
    return read_key(h);
  }
}

// `"key" :` with the whitespace around the colon.
template <typename Handler>
bool reader::read_key(Handler& h) {
  if (p_ == end_ || *p_ != '"') return false;
  const auto key = read_string();
  if (!key || !h.key(*key)) return false;
  skip_whitespace();
  if (p_ == end_ || *p_ != ':') return false;
  ++p_;
  return true;
}

template <typename Handler>
bool reader::read_scalar(Handler& h) {
  switch (*p_) {
    case '"': {
      const auto s = read_string();
      return s && h.string(*s);
    }
    case 't': return read_literal("true") && h.literal();
    case 'f': return read_literal("false") && h.literal();
    case 'n': return read_literal("null") && h.literal();
    default: return read_number(h);
  }
}

// -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
template <typename Handler>
bool reader::read_number(Handler& h) {
  const auto digit = [this] { return p_ != end_ && *p_ >= '0' && *p_ <= '9'; };
  const auto digits = [&] {
    if (!digit()) return false;
    while (digit()) ++p_;
    return true;
  };
  const bool minus = *p_ == '-';
  if (minus) ++p_;
  if (!digit()) return false;
  std::uint64_t magnitude = 0;
  if (*p_ == '0') {
    ++p_;
  } else {
    // 19 digits cannot overflow 64 bits: only a longer number needs the saturating loop.
    const char* const unchecked_end = p_ + std::min<std::ptrdiff_t>(19, end_ - p_);
    for (; p_ != unchecked_end && *p_ >= '0' && *p_ <= '9'; ++p_) {
      magnitude = magnitude * 10 + static_cast<std::uint64_t>(*p_ - '0');
    }
    constexpr auto max = std::numeric_limits<std::uint64_t>::max();
    for (; digit(); ++p_) {
      const auto d = static_cast<std::uint64_t>(*p_ - '0');
      magnitude = magnitude > (max - d) / 10 ? max : magnitude * 10 + d;
    }
  }
  bool integral = true;
  if (p_ != end_ && *p_ == '.') {
    ++p_;
    if (!digits()) return false;
    integral = false;
  }
  if (p_ != end_ && (*p_ == 'e' || *p_ == 'E')) {
    ++p_;
    if (p_ != end_ && (*p_ == '+' || *p_ == '-')) ++p_;
    if (!digits()) return false;
    integral = false;
  }
  return integral ? h.integer(minus && magnitude != 0, magnitude) : h.fraction();
}

// A string, p_ at its opening quote: a view of the text when it has no escapes, else of its decoded
// copy in decoded_, where the runs between escapes are appended whole.
inline std::optional<std::string_view> reader::read_string() {
  const char* const start = ++p_;
  const char* run = start;  // once there was an escape: the first byte not yet appended to decoded_
  bool escaped = false;
  for (;;) {
    // Plain ASCII eight bytes at a time: a prompt is mostly that.
    while (end_ - p_ >= 8) {
      std::uint64_t v;
      std::memcpy(&v, p_, 8);
      if (detail::special_in(v)) break;
      p_ += 8;
    }
    if (p_ == end_) return std::nullopt;
    const auto c = static_cast<unsigned char>(*p_);
    if (c == '"') {
      if (!escaped) return std::string_view(start, static_cast<std::size_t>(p_++ - start));
      decoded_.append(run, p_++);
      return std::string_view(decoded_);
    }
    if (c == '\\') {
      if (!escaped) decoded_.clear();
      escaped = true;
      decoded_.append(run, p_);
      if (!append_escape()) return std::nullopt;
      run = p_;
      continue;
    }
    if (c < 0x20) return std::nullopt;
    const std::size_t n = c < 0x80 ? 1 : utf8_length_here();
    if (n == 0) return std::nullopt;
    p_ += n;
  }
}

// One escape sequence, p_ at its backslash; a \u high surrogate must be followed by a \u low one.
inline bool reader::append_escape() {
  if (end_ - p_ < 2) return false;
  const char e = p_[1];
  p_ += 2;
  switch (e) {
    case '"': decoded_ += '"'; return true;
    case '\\': decoded_ += '\\'; return true;
    case '/': decoded_ += '/'; return true;
    case 'b': decoded_ += '\b'; return true;
    case 'f': decoded_ += '\f'; return true;
    case 'n': decoded_ += '\n'; return true;
    case 'r': decoded_ += '\r'; return true;
    case 't': decoded_ += '\t'; return true;
    case 'u': break;
    default: return false;
  }
  auto cp = read_hex4();
  if (!cp || (*cp >= 0xDC00 && *cp <= 0xDFFF)) return false;
  if (*cp >= 0xD800 && *cp <= 0xDBFF) {
    if (end_ - p_ < 2 || p_[0] != '\\' || p_[1] != 'u') return false;
    p_ += 2;
    const auto low = read_hex4();
    if (!low || *low < 0xDC00 || *low > 0xDFFF) return false;
    cp = 0x10000 + ((*cp - 0xD800) << 10) + (*low - 0xDC00);
  }
  detail::append_utf8(decoded_, *cp);
  return true;
}

inline std::optional<std::uint32_t> reader::read_hex4() {
  if (end_ - p_ < 4) return std::nullopt;
  std::uint32_t v = 0;
  for (int i = 0; i < 4; ++i) {
    const char c = *p_++;
    v <<= 4;
    if (c >= '0' && c <= '9') v |= static_cast<std::uint32_t>(c - '0');
    else if (c >= 'a' && c <= 'f') v |= static_cast<std::uint32_t>(c - 'a' + 10);
    else if (c >= 'A' && c <= 'F') v |= static_cast<std::uint32_t>(c - 'A' + 10);
    else return std::nullopt;
  }
  return v;
}

inline std::size_t reader::utf8_length_here() const {
  return detail::utf8_length(reinterpret_cast<const unsigned char*>(p_), reinterpret_cast<const unsigned char*>(end_));
}

inline bool reader::read_literal(std::string_view word) {
  if (static_cast<std::size_t>(end_ - p_) < word.size() || std::string_view(p_, word.size()) != word) return false;
  p_ += word.size();
  return true;
}

inline void reader::skip_whitespace() {
  while (p_ != end_ && (*p_ == ' ' || *p_ == '\n' || *p_ == '\r' || *p_ == '\t')) ++p_;
}

}  // namespace dplb::server::json
