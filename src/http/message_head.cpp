#include "dplb/http/message_head.hpp"

#include <boost/beast/core/string.hpp>
#include <boost/beast/http/error.hpp>

#include <algorithm>
#include <cstring>

namespace dplb::http {

namespace bhttp = boost::beast::http;

std::size_t field_list::count(bhttp::field name) const noexcept {
  return static_cast<std::size_t>(
      std::count_if(fields_.begin(), fields_.end(), [&](const field_view& f) { return f.name == name; }));
}

std::size_t field_list::count(std::string_view name) const noexcept {
  return static_cast<std::size_t>(std::count_if(fields_.begin(), fields_.end(), [&](const field_view& f) {
    return boost::beast::iequals(f.name_string, name);
  }));
}

std::string_view field_list::value(std::string_view name) const noexcept {
  for (const auto& f : fields_) {
    if (boost::beast::iequals(f.name_string, name)) return f.value;
  }
  return {};
}

std::string_view field_list::value(bhttp::field name) const noexcept {
  for (const auto& f : fields_) {
    if (f.name == name) return f.value;
  }
  return {};
}

void request_head_parser::on_request_impl(bhttp::verb method, boost::beast::string_view method_string,
                                          boost::beast::string_view target, int version, error_code&) {
  head_.method = method;
  head_.method_string = method_string;
  head_.target = target;
  head_.version = static_cast<unsigned>(version);
}

void request_head_parser::on_field_impl(bhttp::field name, boost::beast::string_view name_string,
                                        boost::beast::string_view value, error_code&) {
  if (is_header_done()) return;  // a trailer field, after the last chunk: dropped
  head_.fields.add(name, name_string, value);
}

void request_head_parser::on_body_init_impl(const boost::optional<std::uint64_t>& content_length, error_code&) {
  // Beast has checked the length against body_limit already: the whole body fits, and is read whole.
  if (content_length) body_.reserve(body_.size() + static_cast<std::size_t>(*content_length));
}

std::size_t request_head_parser::on_body_impl(boost::beast::string_view data, error_code&) {
  body_.append(data.data(), data.size());
  return data.size();
}

std::size_t request_head_parser::on_chunk_body_impl(std::uint64_t, boost::beast::string_view data, error_code&) {
  body_.append(data.data(), data.size());
  return data.size();
}

void response_head_parser::on_response_impl(int status, boost::beast::string_view reason, int version,
                                            error_code&) {
  head_.status = static_cast<unsigned>(status);
  head_.reason = reason;
  head_.version = static_cast<unsigned>(version);
}

void response_head_parser::on_field_impl(bhttp::field name, boost::beast::string_view name_string,
                                         boost::beast::string_view value, error_code&) {
  if (is_header_done()) return;  // a trailer of a chunked response: not relayed (the relay re-frames)
  head_.fields.add(name, name_string, value);
}

std::size_t response_head_parser::copy_out(boost::beast::string_view data, error_code& ec) {
  if (sink_left_ == 0) {
    ec = bhttp::error::need_buffer;
    return 0;
  }
  const std::size_t n = std::min(sink_left_, data.size());
  std::memcpy(sink_, data.data(), n);
  sink_ += n;
  sink_left_ -= n;
  return n;
}

}  // namespace dplb::http
