#pragma once
// Message heads as views over the bytes they were parsed from, and the parsers that make them. The relay
// reads a head, decides on it and writes the other side's head from it; a field container that copies
// every name and value into nodes of its own (Beast's `fields`: an allocation per field, a map insertion,
// the destructor) cost more than the rest of the request path together. Here a head is a list of views,
// kept by its owner between messages so that the steady state allocates nothing.
//
// The parsers are Beast's `basic_parser` with a derived class that records views, so that the grammar,
// its limits and its smuggling defences (obs-fold handling, Content-Length with Transfer-Encoding,
// repeated or invalid Content-Length, bad names and values, bad chunk sizes) are Beast's, strict and
// tested, not a new hand parser. Views are valid while the bytes are: the owner parses a head only when
// it is whole in one contiguous buffer (read_head), and uses the views before anything is read into that
// buffer again. A folded header line (obs-fold) is refused before parsing, since Beast unfolds it into
// storage of its own that a view cannot outlive.

#include <boost/beast/http/basic_parser.hpp>
#include <boost/beast/http/field.hpp>
#include <boost/beast/http/verb.hpp>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace dplb::http {

// One field of a head: `name` is Beast's enumeration (field::unknown for a name it does not know).
struct field_view {
  boost::beast::http::field name;
  std::string_view name_string;
  std::string_view value;
};

// The fields of a head, in the order they arrived. clear() keeps the storage for the next head.
class field_list {
 public:
  void clear() noexcept {
    fields_.clear();
    connection_lines_ = 0;
  }
  void add(boost::beast::http::field name, std::string_view name_string, std::string_view value) {
    fields_.push_back({name, name_string, value});
    if (name == boost::beast::http::field::connection) ++connection_lines_;
  }
  // How many Connection lines the head has: most have none, and need no look for the names they list.
  std::size_t connection_lines() const noexcept { return connection_lines_; }

  // How many fields have this name, and the first one's value ("" when none).
  std::size_t count(boost::beast::http::field name) const noexcept;
  std::size_t count(std::string_view name) const noexcept;
  std::string_view value(boost::beast::http::field name) const noexcept;
  std::string_view value(std::string_view name) const noexcept;  // name compared case-insensitively

  auto begin() const noexcept { return fields_.begin(); }
  auto end() const noexcept { return fields_.end(); }
  std::size_t size() const noexcept { return fields_.size(); }
  bool empty() const noexcept { return fields_.empty(); }

 private:
  std::vector<field_view> fields_;
  std::size_t connection_lines_ = 0;
};

// A request head: the request line and the fields, as views.
struct request_head {
  boost::beast::http::verb method = boost::beast::http::verb::unknown;
  std::string_view method_string;
  std::string_view target;
  unsigned version = 11;  // 10 or 11
  field_list fields;
};

// A response head: the status line and the fields, as views.
struct response_head {
  unsigned status = 0;
  std::string_view reason;
  unsigned version = 11;
  field_list fields;
};

// Parses a client's request into a request_head (cleared first) and its body, de-chunked, into `body`
// (appended to; the owner clears it and keeps its capacity). A chunked body's trailer fields are dropped:
// the body leaves for the engine with a Content-Length, and a field that arrives after the body must never
// pass for one the client sent with the head. One parser per request (Beast's parsers cannot be reset;
// constructing one allocates nothing).
class request_head_parser final : public boost::beast::http::basic_parser<true> {
 public:
  request_head_parser(request_head& head, std::string& body) : head_(head), body_(body) { head_.fields.clear(); }

 private:
  using error_code = boost::beast::error_code;
  void on_request_impl(boost::beast::http::verb method, boost::beast::string_view method_string,
                       boost::beast::string_view target, int version, error_code& ec) override;
  void on_response_impl(int, boost::beast::string_view, int, error_code&) override {}
  void on_field_impl(boost::beast::http::field name, boost::beast::string_view name_string,
                     boost::beast::string_view value, error_code& ec) override;
  void on_header_impl(error_code&) override {}
  void on_body_init_impl(const boost::optional<std::uint64_t>& content_length, error_code& ec) override;
  std::size_t on_body_impl(boost::beast::string_view data, error_code& ec) override;
  void on_chunk_header_impl(std::uint64_t, boost::beast::string_view, error_code&) override {}
  std::size_t on_chunk_body_impl(std::uint64_t, boost::beast::string_view data, error_code& ec) override;
  void on_finish_impl(error_code&) override {}

  request_head& head_;
  std::string& body_;
};

// Parses an engine's response into a response_head (cleared first). Body bytes are copied into the sink
// the relay sets before each put (as Beast's buffer_body does): when the sink is full the parser stops
// with error::need_buffer, and sink_left() tells how much of it is unused.
class response_head_parser final : public boost::beast::http::basic_parser<false> {
 public:
  explicit response_head_parser(response_head& head) : head_(head) { head_.fields.clear(); }

  void set_sink(std::span<char> sink) noexcept {
    sink_ = sink.data();
    sink_left_ = sink.size();
  }
  std::size_t sink_left() const noexcept { return sink_left_; }

 private:
  using error_code = boost::beast::error_code;
  void on_request_impl(boost::beast::http::verb, boost::beast::string_view, boost::beast::string_view, int,
                       error_code&) override {}
  void on_response_impl(int status, boost::beast::string_view reason, int version, error_code& ec) override;
  void on_field_impl(boost::beast::http::field name, boost::beast::string_view name_string,
                     boost::beast::string_view value, error_code& ec) override;
  void on_header_impl(error_code&) override {}
  void on_body_init_impl(const boost::optional<std::uint64_t>&, error_code&) override {}
  std::size_t on_body_impl(boost::beast::string_view data, error_code& ec) override { return copy_out(data, ec); }
  void on_chunk_header_impl(std::uint64_t, boost::beast::string_view, error_code&) override {}
  std::size_t on_chunk_body_impl(std::uint64_t, boost::beast::string_view data, error_code& ec) override {
    return copy_out(data, ec);
  }
  void on_finish_impl(error_code&) override {}
  std::size_t copy_out(boost::beast::string_view data, error_code& ec);

  response_head& head_;
  char* sink_ = nullptr;
  std::size_t sink_left_ = 0;
};

}  // namespace dplb::http
