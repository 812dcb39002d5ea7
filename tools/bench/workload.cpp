#include "workload.hpp"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <nlohmann/json.hpp>
#include <random>

namespace dplb::loadgen {

namespace {

// Short common words: a prompt of N of them is N whitespace-separated tokens to the mock engine and
// roughly N tokens to a real tokenizer.
constexpr std::string_view vocabulary[] = {
    "the",   "of",    "and",   "to",    "in",    "is",    "you",   "that",  "it",    "he",    "was",
    "for",   "on",    "are",   "as",    "with",  "his",   "they",  "at",    "be",    "this",  "have",
    "from",  "or",    "one",   "had",   "by",    "word",  "but",   "not",   "what",  "all",   "were",
    "we",    "when",  "your",  "can",   "said",  "there", "use",   "an",    "each",  "which", "she",
    "do",    "how",   "their", "if",    "will",  "up",    "other", "about", "out",   "many",  "then",
    "them",  "these", "so",    "some",  "her",   "would", "make",  "like",  "him",   "into",  "time",
    "has",   "look",  "two",   "more",  "write", "go",    "see",   "number", "no",   "way",   "could",
    "people", "my",   "than",  "first", "water", "been",  "call",  "who",   "oil",   "its",   "now",
    "find",  "long",  "down",  "day",   "did",   "get",   "come",  "made",  "may",   "part",  "over",
    "new",   "sound", "take",  "only",  "little", "work", "know",  "place", "year",  "live",  "me",
    "back",  "give",  "most",  "very",  "after", "thing", "our",   "just",  "name",  "good",  "man",
    "think", "say",   "great", "where", "help",  "much",  "before", "line"};

// splitmix64: a fast, well-mixed generator; each request gets its own stream so prompts do not depend
// on which thread builds them or in what order.
struct splitmix64 {
  std::uint64_t state;
  std::uint64_t operator()() {
    std::uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
};

std::size_t draw_length(std::mt19937_64& rng, std::size_t length, double ratio) {
  const auto low = static_cast<std::size_t>(std::floor(static_cast<double>(length) * (1.0 - ratio)));
  const auto high = static_cast<std::size_t>(std::ceil(static_cast<double>(length) * (1.0 + ratio)));
  const std::size_t drawn = low == high ? low : std::uniform_int_distribution<std::size_t>(low, high)(rng);
  return drawn == 0 ? 1 : drawn;
}

}  // namespace

std::vector<request_plan> plan_requests(const request_shape& shape, std::size_t count, std::uint64_t seed) {
  std::vector<bool> is_long(count, false);
  if (shape.long_share > 0) {
    std::mt19937_64 classes(seed ^ 0x10a9c1a55ULL);
    std::bernoulli_distribution draw(std::min(1.0, shape.long_share));
    for (std::size_t i = 0; i < count; ++i) is_long[i] = draw(classes);
  }
  const auto len = [&](std::size_t i, std::size_t normal, std::size_t long_len) {
    return is_long[i] && long_len != 0 ? long_len : normal;
  };
  std::mt19937_64 rng(seed);
  std::vector<request_plan> plans(count);
  for (std::size_t i = 0; i < count; ++i) {
    plans[i].input_words = draw_length(rng, len(i, shape.input_len, shape.long_input_len), shape.range_ratio);
  }
  for (std::size_t i = 0; i < count; ++i) {
    plans[i].max_tokens = draw_length(rng, len(i, shape.output_len, shape.long_output_len), shape.range_ratio);
  }
  splitmix64 seeds{seed ^ 0x5eedf00dULL};
  for (auto& plan : plans) plan.prompt_seed = seeds();
  if (shape.prefix_groups > 0) {
    // A stream of its own, as the long class's: the lengths and the own words stay as without groups.
    std::mt19937_64 groups(seed ^ 0x9f0c4e5a11ULL);
    std::uniform_int_distribution<std::size_t> draw(0, shape.prefix_groups - 1);
    for (auto& plan : plans) {
      const std::size_t group = draw(groups);
      plan.prefix_group = static_cast<int>(group);
      plan.prefix_words = shape.prefix_len;
      plan.prefix_seed = group_prefix_seed(seed, group);
    }
  }
  return plans;
}

std::uint64_t group_prefix_seed(std::uint64_t seed, std::size_t group) {
  splitmix64 mix{seed ^ 0x9e0f1c5ULL};
  mix.state += static_cast<std::uint64_t>(group) * 0xd1b54a32d192ed03ULL;
  return mix();
}

std::vector<double> arrival_offsets(std::size_t count, double rate, double burstiness, std::uint64_t seed,
                                    double spread_s) {
  std::vector<double> offsets(count, 0.0);
  if (count == 0) return offsets;
  if (std::isinf(rate)) {
    // Computed from k, not summed gap by gap: the schedule stays exact however long the burst is.
    for (std::size_t k = 1; k < count; ++k) {
      offsets[k] = spread_s * static_cast<double>(k) / static_cast<double>(count);
    }
    return offsets;
  }
  // A separate stream from the lengths', so changing the rate leaves the prompts as they were.
  std::mt19937_64 rng(seed ^ 0xa441a1ULL);
  std::gamma_distribution<double> gap(burstiness, 1.0 / (rate * burstiness));
  double at = 0.0;
  for (std::size_t i = 1; i < count; ++i) {
    at += gap(rng);
    offsets[i] = at;
  }
  return offsets;
}

void append_prompt(std::string& out, std::size_t words, std::uint64_t seed) {
  splitmix64 rng{seed};
  out.reserve(out.size() + words * 6);
  for (std::size_t i = 0; i < words; ++i) {
    if (i != 0) out.push_back(' ');
    out.append(vocabulary[rng() % std::size(vocabulary)]);
  }
}

bool is_chat_endpoint(std::string_view endpoint) {
  return endpoint.find("/chat/completions") != std::string_view::npos;
}

void append_plan_prompt(std::string& out, const request_plan& plan) {
  if (plan.prefix_words > 0) {
    append_prompt(out, plan.prefix_words, plan.prefix_seed);
    out.push_back(' ');
  }
  append_prompt(out, plan.input_words, plan.prompt_seed);
}

namespace {

// What follows the prompt or the messages in every body.
void append_body_tail(std::string& body, const request_shape& shape, bool chat, std::size_t max_tokens) {
  body.append(chat ? ",\"max_completion_tokens\":" : ",\"max_tokens\":");
  body.append(std::to_string(max_tokens));
  body.append(shape.stream ? ",\"stream\":true" : ",\"stream\":false");
  if (shape.stream && shape.include_usage) body.append(",\"stream_options\":{\"include_usage\":true}");
  if (shape.ignore_eos) body.append(",\"ignore_eos\":true");
  body.push_back('}');
}

}  // namespace

std::string request_body(const request_shape& shape, std::string_view model, const request_plan& plan) {
  const bool chat = is_chat_endpoint(shape.endpoint);
  std::string body;
  body.reserve(plan.prompt_words() * 6 + 256);
  body.append("{\"model\":").append(nlohmann::json(model).dump());
  body.append(chat ? ",\"messages\":[{\"role\":\"user\",\"content\":\"" : ",\"prompt\":\"");
  append_plan_prompt(body, plan);
  body.append(chat ? "\"}]" : "\"");
  append_body_tail(body, shape, chat, plan.max_tokens);
  return body;
}

void append_answer_text(std::string_view json, std::string& out) {
  const auto event = nlohmann::json::parse(json, nullptr, false);
  if (!event.is_object()) return;
  const auto choices = event.find("choices");
  if (choices == event.end() || !choices->is_array() || choices->empty() || !choices->front().is_object()) return;
  const auto& choice = choices->front();
  const auto append_string = [&](const nlohmann::json& holder, const char* key) {
    if (!holder.is_object()) return false;
    const auto value = holder.find(key);
    if (value == holder.end() || !value->is_string()) return false;
    out += value->get_ref<const std::string&>();
    return true;
  };
  if (append_string(choice, "text")) return;
  if (const auto delta = choice.find("delta"); delta != choice.end() && append_string(*delta, "content")) return;
  if (const auto message = choice.find("message"); message != choice.end()) append_string(*message, "content");
}

std::size_t count_words(std::string_view text) {
  std::size_t words = 0;
  bool in_word = false;
  for (const char c : text) {
    const bool space = c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
    if (!space && !in_word) ++words;
    in_word = !space;
  }
  return words;
}

void conversation::add_user_turn(const request_plan& plan) {
  request_plan own = plan;
  if (!messages_.empty()) own.prefix_words = 0;
  std::string content;
  append_plan_prompt(content, own);
  words_ += own.prompt_words();
  messages_.push_back({true, std::move(content)});
}

void conversation::add_answer(std::string text) {
  words_ += count_words(text);
  messages_.push_back({false, std::move(text)});
}

std::string conversation::request_body(const request_shape& shape, std::string_view model,
                                       std::size_t max_tokens) const {
  std::string body;
  std::size_t bytes = 256;
  for (const auto& m : messages_) bytes += m.content.size() + 48;
  body.reserve(bytes);
  body.append("{\"model\":").append(nlohmann::json(model).dump()).append(",\"messages\":[");
  for (std::size_t i = 0; i < messages_.size(); ++i) {
    if (i != 0) body.push_back(',');
    body.append(messages_[i].from_user ? "{\"role\":\"user\",\"content\":" : "{\"role\":\"assistant\",\"content\":");
    // The answers come from the server: escape them (the generated prompts need none, but one path is simpler).
    body.append(nlohmann::json(messages_[i].content).dump()).push_back('}');
  }
  body.push_back(']');
  append_body_tail(body, shape, true, max_tokens);
  return body;
}

}  // namespace dplb::loadgen

namespace dplb::loadgen {

std::string validate(const run_options& options) {
  const auto& shape = options.shape;
  if (options.host.empty()) return "host is empty";
  if (options.port == 0) return "port must be 1..65535";
  if (!(options.request_rate > 0)) return "request rate must be > 0 (or inf)";
  if (!(options.burstiness > 0) || std::isinf(options.burstiness)) return "burstiness must be a finite number > 0";
  // The bound catches a wrapped or absurd value (about four months), not a real burst.
  if (!(options.burst_spread.count() >= 0 && options.burst_spread.count() <= 1e7)) {
    return "burst spread (--burst-spread-ms) must be >= 0 (and under 10^7 s)";
  }
  // A finite rate paces requests itself; a spread on top would be a second, conflicting schedule.
  if (options.burst_spread.count() > 0 && !std::isinf(options.request_rate)) {
    return "a burst spread (--burst-spread-ms) needs an infinite request rate (--request-rate inf)";
  }
  if (options.threads == 0 || options.threads > 256) return "threads must be 1..256";
  if (options.timeout.count() <= 0) return "timeout must be > 0";
  if (shape.endpoint.empty() || shape.endpoint.front() != '/') return "endpoint must start with '/'";
  if (!(shape.range_ratio >= 0.0 && shape.range_ratio < 1.0)) return "range ratio must be in [0, 1)";
  // The upper bounds catch a negative number wrapped around by an unsigned parse, not real workloads.
  if (options.num_prompts > 100'000'000) return "number of prompts must be <= 100000000";
  if (options.max_concurrency > 10'000'000) return "max concurrency must be <= 10000000";
  if (shape.input_len == 0 || shape.input_len > 10'000'000) return "input length must be 1..10000000";
  if (shape.output_len == 0 || shape.output_len > 10'000'000) return "output length must be 1..10000000";
  if (!(shape.long_share >= 0.0 && shape.long_share <= 1.0)) return "long share must be in [0, 1]";
  if (shape.long_input_len > 10'000'000) return "long input length must be 0..10000000";
  if (shape.long_output_len > 10'000'000) return "long output length must be 0..10000000";
  if (shape.prefix_groups > 1'000'000) return "prefix groups must be <= 1000000";
  if (shape.prefix_groups > 0 && (shape.prefix_len == 0 || shape.prefix_len > 10'000'000)) {
    return "prefix length must be 1..10000000 with prefix groups";
  }
  const auto& sessions = options.chat_sessions;
  if (sessions.enabled()) {
    if (!is_chat_endpoint(shape.endpoint)) return "sessions need the chat endpoint (--backend openai-chat)";
    if (sessions.turns == 0 || sessions.turns > 1'000'000) return "turns must be 1..1000000";
    if (sessions.sessions > 100'000'000 / sessions.turns || options.num_prompts != sessions.sessions * sessions.turns) {
      return "with sessions the number of prompts must be sessions * turns";
    }
  }
  const auto bad_char = [](std::string_view text) {
    return text.find_first_of("\r\n") != std::string_view::npos;
  };
  if (bad_char(shape.endpoint)) return "endpoint contains a line break";
  for (const auto& [name, value] : shape.extra_headers) {
    if (name.empty() || bad_char(name) || name.find_first_of(": \t") != std::string::npos)
      return "bad header name '" + name + "'";
    if (bad_char(value)) return "header '" + name + "' has a line break in its value";
  }
  if (bad_char(sessions.header) || sessions.header.find_first_of(": \t") != std::string::npos) {
    return "bad session header name '" + sessions.header + "'";
  }
  return {};
}

}  // namespace dplb::loadgen
