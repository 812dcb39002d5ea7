// libFuzzer target for the two legs' bodies of prefill/decode disaggregation (src/pd/leg_bodies.cpp) and the
// tree-less JSON reads under them (src/support/json_text.cpp): a client's body and an engine's prefill answer
// are network input. Checks, for every input (taken as a client body, and as a prefill answer):
//  - nothing crashes or hangs, however the text is broken or nested;
//  - a body that parses as a JSON object (nested at most pd::max_body_nesting deep) and starts with its brace
//    (a byte order mark, which nlohmann skips, is refused) always gets a prefill body, and that body is the client's object with kv_transfer_params asking for a remote decode, stream
//    false, max_tokens 1, and without stream_options, min_tokens, min_completion_tokens;
//  - a top-level member's raw text (json_member_text) lies inside the input, and, on the canonical text of a
//    parsed object, parses to the member's value;
//  - such an object has a top-level kv_transfer_params exactly when pd::sets_kv_transfer_params says so;
//  - the decode body of a parsed object, given a params object, parses to the object plus those params.
// Any difference traps with a description.

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "dplb/pd/leg_bodies.hpp"
#include "dplb/support/json_text.hpp"

namespace {

using json = nlohmann::json;

[[noreturn]] void fail(const char* what, std::string_view input) {
  std::fprintf(stderr, "fuzz_pd_bodies: %s on %.*s\n", what, static_cast<int>(input.size()), input.data());
  __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const auto prefill = dplb::pd::prefill_body(input);
  if (const auto member = dplb::support::json_member_text(input, "kv_transfer_params")) {
    if (member->data() < input.data() || member->data() + member->size() > input.data() + input.size()) {
      fail("a member's text outside its input", input);
    }
  }
  (void)dplb::pd::kv_transfer_params_of(input);
  (void)dplb::pd::decode_body(input, "{}");

  if (dplb::support::json_nesting_depth(input, dplb::pd::max_body_nesting) > dplb::pd::max_body_nesting) return 0;
  const json dom = json::parse(input, nullptr, /*allow_exceptions=*/false);
  const auto first = input.find_first_not_of(" \t\r\n");
  if (!dom.is_object() || first == std::string_view::npos || input[first] != '{') {
    if (prefill) fail("a prefill body from a body that is not a braced JSON object", input);
    return 0;
  }
  if (!prefill) fail("no prefill body for a JSON object", input);
  // nlohmann stops at a NUL as at the end of the text, where Python's json (the engines') reads a body with a
  // NUL among its first bytes as UTF-16 or UTF-32: dplb refuses such a body whatever it holds, so the
  // property is for text without one.
  const bool utf8_text = input.find('\0') == std::string_view::npos;
  if (utf8_text && dom.contains("kv_transfer_params") != dplb::pd::sets_kv_transfer_params(input)) {
    fail("a client's top-level kv_transfer_params found where JSON has none, or missed", input);
  }
  json expected = dom;
  for (const char* key : {"stream_options", "min_tokens", "min_completion_tokens"}) expected.erase(key);
  expected["kv_transfer_params"] = json{{"do_remote_decode", true},   {"do_remote_prefill", false},
                                        {"remote_engine_id", nullptr}, {"remote_block_ids", nullptr},
                                        {"remote_host", nullptr},      {"remote_port", nullptr}};
  expected["stream"] = false;
  expected["max_tokens"] = 1;
  if (expected.contains("max_completion_tokens")) expected["max_completion_tokens"] = 1;
  if (json::parse(*prefill, nullptr, false) != expected) fail("the prefill body is not the expected object", input);

  const std::string canonical = dom.dump();  // no repeated keys, no blanks
  for (const auto& [key, value] : dom.items()) {
    const auto text = dplb::support::json_member_text(canonical, json(key).dump().substr(1, json(key).dump().size() - 2));
    if (!text || json::parse(*text, nullptr, false) != value) fail("a member's text is not its value", canonical);
  }
  const std::string params = R"({"do_remote_prefill":true,"remote_block_ids":[1,2],"remote_engine_id":"e"})";
  const auto decode = dplb::pd::decode_body(canonical, params);
  json with_params = dom;
  with_params["kv_transfer_params"] = json::parse(params);
  if (!decode || json::parse(*decode, nullptr, false) != with_params) fail("the decode body is not the object plus params", canonical);
  return 0;
}
