#include "dplb/http/header_sanitizer.hpp"

#include <boost/beast/core/string.hpp>

#include <algorithm>
#include <cstring>

namespace dplb::http {

namespace bhttp = boost::beast::http;

bool is_hop_by_hop(bhttp::field name) noexcept {
  switch (name) {
    case bhttp::field::connection:
    case bhttp::field::keep_alive:
    case bhttp::field::proxy_connection:
    case bhttp::field::te:
    case bhttp::field::transfer_encoding:
    case bhttp::field::upgrade:
    case bhttp::field::proxy_authorization:
    case bhttp::field::proxy_authenticate:
      return true;
    default:
      return false;
  }
}

connection_options::connection_options(const field_list& fields) noexcept {
  if (fields.connection_lines() == 0) return;
  for (const auto& field : fields) {
    if (field.name != bhttp::field::connection) continue;
    for_each_list_item(field.value, [&](std::string_view option) {
      if (count_ == max_options) {
        too_many_ = true;
        return;
      }
      options_[count_++] = {option.data(), option.size()};
    });
  }
}

bool connection_options::names(std::string_view field_name) const noexcept {
  if (count_ == 0) return false;  // the common case: no Connection, or only "keep-alive"/"close" below
  for (std::size_t i = 0; i < count_; ++i) {
    if (boost::beast::iequals(std::string_view(options_[i].data, options_[i].size), field_name)) {
      return !boost::beast::iequals(field_name, "content-length");
    }
  }
  return false;
}

head_scan find_head_end(std::string_view bytes, const head_scan& resume) noexcept {
  // Leading empty lines before a request line are allowed (RFC 9112 2.2) and are not the end.
  std::size_t start = 0;
  while (start < bytes.size() && (bytes[start] == '\r' || bytes[start] == '\n')) ++start;
  // One pass from line end to line end: the byte after each '\n' either ends the head (an empty line),
  // folds the line before (SP or HTAB: obs-fold), or starts the next field. A scan that resumes carries
  // the folds seen before.
  std::size_t i = std::max(resume.searched, start);
  bool folded = resume.folded;
  while (i < bytes.size()) {
    const void* nl = std::memchr(bytes.data() + i, '\n', bytes.size() - i);
    if (!nl) return {false, folded, 0, bytes.size()};
    const std::size_t at = static_cast<std::size_t>(static_cast<const char*>(nl) - bytes.data());
    const std::size_t next = at + 1;
    if (next >= bytes.size()) return {false, folded, 0, at};  // the next line's first byte is not here yet
    const char c = bytes[next];
    if (c == '\n' || (c == '\r' && next + 1 < bytes.size() && bytes[next + 1] == '\n')) {
      return {true, folded, next + (c == '\n' ? 1 : 2), 0};
    }
    if (c == '\r' && next + 1 >= bytes.size()) return {false, folded, 0, at};
    folded = folded || c == ' ' || c == '\t';
    i = next;
  }
  return {false, folded, 0, bytes.size() > 0 ? bytes.size() - 1 : 0};
}

std::optional<framing_problem> check_request_framing(const field_list& fields) noexcept {
  std::size_t content_lengths = 0;
  std::size_t transfer_encodings = 0;
  std::string_view content_length;
  std::string_view transfer_encoding;
  for (const auto& field : fields) {
    if (field.name == bhttp::field::content_length) {
      if (content_lengths++ == 0) content_length = field.value;
    } else if (field.name == bhttp::field::transfer_encoding) {
      if (transfer_encodings++ == 0) transfer_encoding = field.value;
    }
  }
  if (content_lengths > 0 && transfer_encodings > 0) {
    return framing_problem{400, "request has both Content-Length and Transfer-Encoding"};
  }
  if (content_lengths > 1) return framing_problem{400, "request has more than one Content-Length"};
  if (content_lengths == 1) {
    if (content_length.empty() || content_length.size() > 19 ||
        !std::all_of(content_length.begin(), content_length.end(), [](char c) { return c >= '0' && c <= '9'; })) {
      return framing_problem{400, "request has an invalid Content-Length"};
    }
  }
  if (transfer_encodings > 1) return framing_problem{400, "request has more than one Transfer-Encoding"};
  if (transfer_encodings == 1) {
    std::size_t codings = 0;
    bool only_chunked = true;
    for_each_list_item(transfer_encoding, [&](std::string_view item) {
      ++codings;
      only_chunked = only_chunked && boost::beast::iequals(item, "chunked");
    });
    if (codings != 1 || !only_chunked) {
      return framing_problem{501, "request uses a transfer coding other than chunked"};
    }
  }
  return std::nullopt;
}

}  // namespace dplb::http
