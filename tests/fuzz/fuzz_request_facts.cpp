// libFuzzer target for dplb::server::inspect_request_body, which reads a client's request body. Checks,
// for every input:
//  - the invariants of request_facts: nothing but defaults unless the body is a JSON object, exact
//    prompt counts only from one, 1 <= choices <= max_choices;
//  - agreement with a reference written the obvious way: nlohmann's DOM (whole-body parse, then lookups
//    in the resulting object). This checks both halves of inspect_request_body: its own JSON reader
//    accepts exactly what nlohmann accepts, and its handler's path tracking follows the rules in
//    request_facts.hpp. The DOM keeps the last of repeated keys, as the rules do.
//  - the prefix chain (asked for by prefix-aware routing): asking for it changes no other fact, and it
//    equals a chain fed from the DOM by the rules in request_facts.hpp. The chain is compared on the
//    DOM's own serialisation, which has no repeated keys (where the chain is approximate by design).
// Any difference traps with both results printed.

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "dplb/balancer/prefix_index.hpp"
#include "dplb/server/request_facts.hpp"

namespace {

using dplb::server::request_facts;
using json = nlohmann::json;

void print(const char* label, const request_facts& f) {
  std::fprintf(stderr,
               "  %-9s json_object=%d model=\"%s\" prompt_tokens=%u exact=%d max_tokens=%s%u choices=%u "
               "data_parallel_rank=%s%lld priority=%s%lld priority_key=%d chain=%zu ids=%zu cache_salt=\"%s\"\n",
               label, f.json_object, f.model.c_str(), f.prompt_tokens, f.prompt_tokens_exact,
               f.max_tokens ? "" : "(none)", f.max_tokens.value_or(0), f.choices, f.data_parallel_rank ? "" : "(none)",
               static_cast<long long>(f.data_parallel_rank.value_or(0)), f.priority ? "" : "(none)",
               static_cast<long long>(f.priority.value_or(0)), f.has_priority_key, f.prefix_chain.size(),
               f.prompt_token_ids.size(), f.cache_salt.c_str());
}

[[noreturn]] void fail(const char* what, const request_facts& expected, const request_facts& got) {
  std::fprintf(stderr, "fuzz_request_facts: %s\n", what);
  print("expected", expected);
  print("got", got);
  __builtin_trap();
}

std::uint64_t estimate(const json& text) {
  const auto& s = text.get_ref<const json::string_t&>();
  return (s.size() + dplb::server::estimated_chars_per_token - 1) / dplb::server::estimated_chars_per_token;
}

std::uint32_t clamp_u32(std::uint64_t v) {
  return static_cast<std::uint32_t>(std::min<std::uint64_t>(v, std::numeric_limits<std::uint32_t>::max()));
}

// A non-negative integer (-0 included, which the DOM keeps as a signed 0).
std::optional<std::uint64_t> non_negative(const json& v) {
  if (v.is_number_unsigned()) return v.get<std::uint64_t>();
  if (v.is_number_integer() && v.get<std::int64_t>() == 0) return 0;
  return std::nullopt;  // negatives, fractions, other types
}

std::optional<std::uint32_t> token_limit(const json& body, const char* key) {
  const auto it = body.find(key);
  if (it == body.end()) return std::nullopt;
  if (const auto v = non_negative(*it)) return clamp_u32(*v);
  return std::nullopt;
}

// "prompt": its token count and whether it was token ids only.
std::pair<std::uint64_t, bool> prompt_of(const json& prompt) {
  if (prompt.is_string()) return {estimate(prompt), false};
  if (!prompt.is_array()) return {0, false};
  std::uint64_t tokens = 0;
  bool ids_only = true;
  for (const auto& item : prompt) {
    if (item.is_number_integer()) {
      ++tokens;
    } else if (item.is_string()) {
      tokens += estimate(item);
      ids_only = false;
    } else if (item.is_array()) {
      for (const auto& id : item) {
        if (id.is_number_integer()) ++tokens;
        else ids_only = false;
      }
    } else {
      ids_only = false;
    }
  }
  return {tokens, ids_only};
}

// The token ids the KV-cache events are matched on (request_facts::prompt_token_ids): a prompt of ids, all
// at the top (flat) or all arrays (a batch: its first), each a non-negative id of at most 32 bits; none
// otherwise.
std::vector<std::uint32_t> reference_ids(const json& body) {
  const auto prompt = body.find("prompt");
  if (prompt == body.end() || !prompt->is_array() || prompt->empty() || !prompt_of(*prompt).second) return {};
  const bool arrays = std::ranges::all_of(*prompt, [](const json& item) { return item.is_array(); });
  const bool flat = std::ranges::none_of(*prompt, [](const json& item) { return item.is_array(); });
  if (!arrays && !flat) return {};
  std::vector<std::uint32_t> out;
  for (const auto& id : arrays ? prompt->front() : *prompt) {
    const auto value = non_negative(id);
    if (!value || *value > std::numeric_limits<std::uint32_t>::max()) return {};
    out.push_back(static_cast<std::uint32_t>(*value));
  }
  return out;
}

std::string reference_salt(const json& body) {
  const auto salt = body.find("cache_salt");
  return salt != body.end() && salt->is_string() ? salt->get<std::string>() : std::string();
}

std::uint64_t messages_tokens(const json& messages) {
  if (!messages.is_array()) return 0;
  std::uint64_t tokens = 0;
  for (const auto& message : messages) {
    if (!message.is_object() || !message.contains("content")) continue;
    const auto& content = message["content"];
    if (content.is_string()) tokens += estimate(content);
    if (!content.is_array()) continue;
    for (const auto& part : content) {
      if (part.is_object() && part.contains("text") && part["text"].is_string()) tokens += estimate(part["text"]);
    }
  }
  return tokens;
}

// The DOM of a body: null when it is not valid JSON, nullopt when the two readers may differ on it by
// design: nlohmann refuses a number beyond a double's range (`1e400`), which is valid JSON (RFC 8259
// leaves the range to the implementation) and which Python's json, in vLLM, reads as inf.
std::optional<json> dom_of(std::string_view body) {
  if (body.find('\0') != std::string_view::npos) return json();  // nlohmann stops at a NUL, as at the end
  try {
    return json::parse(body.begin(), body.end());
  } catch (const json::out_of_range&) {
    return std::nullopt;
  } catch (const json::exception&) {
    return json();
  }
}

request_facts reference(const json& j) {
  if (!j.is_object()) return {};
  request_facts f;
  f.json_object = true;
  if (const auto it = j.find("model"); it != j.end() && it->is_string()) f.model = it->get<std::string>();
  if (const auto it = j.find("prompt"); it != j.end()) {
    const auto [tokens, exact] = prompt_of(*it);
    f.prompt_tokens = clamp_u32(tokens);
    f.prompt_tokens_exact = exact;
  } else if (const auto it = j.find("messages"); it != j.end()) {
    f.prompt_tokens = clamp_u32(messages_tokens(*it));
  }
  f.max_tokens = token_limit(j, "max_completion_tokens");
  if (!f.max_tokens) f.max_tokens = token_limit(j, "max_tokens");
  if (const auto it = j.find("n"); it != j.end()) {
    if (const auto n = non_negative(*it); n && *n >= 1) {
      f.choices = static_cast<std::uint32_t>(std::min<std::uint64_t>(*n, dplb::server::max_choices));
    }
  }
  const auto signed_integer = [&](const char* key) -> std::optional<std::int64_t> {
    const auto it = j.find(key);
    if (it == j.end()) return std::nullopt;
    if (it->is_number_unsigned()) {
      if (it->get<std::uint64_t>() <= static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
        return it->get<std::int64_t>();
      }
    } else if (it->is_number_integer()) {
      return it->get<std::int64_t>();
    }
    return std::nullopt;
  };
  f.data_parallel_rank = signed_integer("data_parallel_rank");
  f.priority = signed_integer("priority");
  f.has_priority_key = j.contains("priority");
  return f;
}

// The prefix chain the rules in request_facts.hpp give for a JSON object: a text prompt's bytes; in a
// batch, each text followed by a separator and each non-negative id as its 4 bytes (also in nested id
// arrays); without a prompt, each message object's content text (or its parts' "text"), followed by a
// separator.
std::vector<std::uint64_t> reference_chain(const json& j) {
  using dplb::balancer::prefix_chain_builder;
  prefix_chain_builder chain;
  const auto feed_id = [&](const json& id) {
    const auto value = non_negative(id);  // -0 is token 0, as the reader reads it
    if (!value) return;                   // negatives are counted but not fed
    const auto narrow = static_cast<std::uint32_t>(*value);
    chain.feed(std::string_view(reinterpret_cast<const char*>(&narrow), sizeof narrow));
  };
  const auto text = [](const json& s) { return std::string_view(s.get_ref<const json::string_t&>()); };
  const auto prompt = j.find("prompt");
  const auto messages = j.find("messages");
  if (prompt != j.end()) {
    if (prompt->is_string()) chain.feed(text(*prompt));
    if (prompt->is_array()) {
      for (const auto& item : *prompt) {
        if (item.is_string()) {
          chain.feed(text(item));
          chain.separate();
        } else if (item.is_array()) {
          for (const auto& id : item) feed_id(id);
        } else {
          feed_id(item);
        }
      }
    }
  } else if (messages != j.end()) {
    for (const auto& message : messages->is_array() ? *messages : json::array()) {
      if (!message.is_object()) continue;
      if (const auto content = message.find("content"); content != message.end()) {
        if (content->is_string()) chain.feed(text(*content));
        if (content->is_array()) {
          for (const auto& part : *content) {
            if (!part.is_object()) continue;
            if (const auto t = part.find("text"); t != part.end() && t->is_string()) chain.feed(text(*t));
          }
        }
      }
      chain.separate();
    }
  } else {
    return {};
  }
  auto blocks = chain.take();
  std::string model;
  if (const auto it = j.find("model"); it != j.end() && it->is_string()) model = it->get<std::string>();
  prefix_chain_builder::reseed(blocks, prefix_chain_builder::seed_of(model));
  return blocks;
}

// The DOM turns an integer literal beyond 64 bits (or below INT64_MIN: 19 digits may be enough) into a
// double, where the rules still read it as an integer (a huge max_tokens clamps): the reference cannot
// tell those apart from `1e30`.
bool has_integer_beyond_64_bits(std::string_view body) {
  std::size_t run = 0;
  for (const char c : body) {
    run = c >= '0' && c <= '9' ? run + 1 : 0;
    if (run >= 19) return true;
  }
  return false;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  const request_facts got = dplb::server::inspect_request_body(body);

  if (!got.json_object && got != request_facts{}) fail("facts from a body that is not a JSON object", {}, got);
  if (got.choices < 1 || got.choices > dplb::server::max_choices) fail("choices out of range", {}, got);

  if (has_integer_beyond_64_bits(body)) return 0;
  const auto dom = dom_of(body);
  if (!dom) return 0;
  const request_facts expected = reference(*dom);
  if (got != expected) fail("inspect_request_body differs from the DOM reference", expected, got);

  request_facts with_chain = dplb::server::inspect_request_body(body, /*prefix_chain=*/true);
  const auto chain = std::move(with_chain.prefix_chain);
  with_chain.prefix_chain.clear();
  // What only a chain's asker reads (the KV-cache events' inputs), checked against the DOM below.
  with_chain.prompt_token_ids.clear();
  with_chain.cache_salt.clear();
  if (with_chain != got) fail("asking for the prefix chain changed the other facts", got, with_chain);
  if (!dom->is_object()) {
    if (!chain.empty()) fail("a prefix chain from a body that is not a JSON object", got, with_chain);
    return 0;
  }
  const std::string canonical = dom->dump();  // no repeated keys
  const auto canonical_facts = dplb::server::inspect_request_body(canonical, true);
  if (canonical_facts.prompt_token_ids != reference_ids(*dom) || canonical_facts.cache_salt != reference_salt(*dom)) {
    std::fprintf(stderr, "fuzz_request_facts: the token ids or the cache_salt differ from the DOM reference on %s\n",
                 canonical.c_str());
    __builtin_trap();
  }
  if (canonical_facts.prefix_chain != reference_chain(*dom)) {
    std::fprintf(stderr, "fuzz_request_facts: the prefix chain differs from the DOM reference on %s\n",
                 canonical.c_str());
    __builtin_trap();
  }
  return 0;
}
