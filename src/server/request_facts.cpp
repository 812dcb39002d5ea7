#include "dplb/server/request_facts.hpp"

#include <algorithm>
#include <array>
#include <limits>
#include <utility>

#include <nlohmann/json.hpp>

#include "dplb/balancer/prefix_index.hpp"
#include "dplb/support/json_text.hpp"
#include "json_reader.hpp"

namespace dplb::server {

namespace {

// Where a value sits, as far as the rules in the header are concerned; `other` for everything they do
// not read.
enum class place : std::uint8_t {
  other,
  root,
  model,
  prompt,
  messages,
  max_tokens,
  max_completion_tokens,
  choices,
  data_parallel_rank,
  priority,
  cache_salt,
  prompt_item,  // an element of "prompt": [...]
  prompt_id,    // an element of an array inside "prompt": [[...], ...]
  message,      // an element of "messages"
  content,      // a message's "content"
  part,         // an element of a content array
  part_text,    // a content part's "text"
};

// The containers the handler walks into. Every other container is skipped by counting its depth, so
// the handler's state stays this small however deep the body nests.
enum class frame : std::uint8_t { top, prompt_batch, prompt_ids, messages, message, parts, part };

place top_level_place(std::string_view key) {
  if (key == "model") return place::model;
  if (key == "prompt") return place::prompt;
  if (key == "messages") return place::messages;
  if (key == "max_tokens") return place::max_tokens;
  if (key == "max_completion_tokens") return place::max_completion_tokens;
  if (key == "n") return place::choices;
  if (key == "data_parallel_rank") return place::data_parallel_rank;
  if (key == "priority") return place::priority;
  if (key == "cache_salt") return place::cache_salt;
  return place::other;
}

std::uint64_t estimate_tokens(std::string_view text) {
  return (text.size() + estimated_chars_per_token - 1) / estimated_chars_per_token;
}

std::uint32_t clamp_u32(std::uint64_t v) {
  return static_cast<std::uint32_t>(std::min<std::uint64_t>(v, std::numeric_limits<std::uint32_t>::max()));
}

// A JSON integer of any size, as the reader reports it: its sign and its magnitude, saturated.
struct whole_number {
  bool negative = false;
  std::uint64_t magnitude = 0;

  std::optional<std::int64_t> as_int64() const {
    constexpr auto max = static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max());
    if (!negative) return magnitude <= max ? std::optional(static_cast<std::int64_t>(magnitude)) : std::nullopt;
    if (magnitude <= max) return -static_cast<std::int64_t>(magnitude);
    if (magnitude == max + 1) return std::numeric_limits<std::int64_t>::min();
    return std::nullopt;
  }
};

// The reader's handler (json_reader.hpp): tracks where the reader is (a short stack of the frames
// above, then a depth count in skipped containers) and keeps the running counts; copies no string but
// the model.
class facts_handler {
 public:
  explicit facts_handler(bool chain) : chain_(chain) {}

  bool literal() { return leaf(); }
  bool fraction() { return leaf(); }
  // A huge integer is still an integer, saturated: a huge max_tokens clamps rather than vanishes.
  bool integer(bool negative, std::uint64_t magnitude) { return integer({negative, magnitude}); }
  bool string(std::string_view s);
  bool key(std::string_view k);
  bool start_object();
  bool start_array();
  bool end_object();
  bool end_array() { return leave(); }

  request_facts result() &&;

 private:
  place take_place();
  bool integer(whole_number n);
  bool leaf();
  bool enter(frame f);
  bool skip();
  bool leave();

  static constexpr std::size_t max_frames = 5;  // top, messages, message, parts, part
  std::array<frame, max_frames> frames_{};
  std::size_t depth_ = 0;        // frames in use
  std::uint64_t skipped_ = 0;    // depth inside a skipped container
  place after_key_ = place::other;  // the place of the value that follows the key just read
  bool object_ = false;

  request_facts facts_;
  bool prompt_seen_ = false;
  bool prompt_ids_only_ = false;  // the prompt is an array whose every leaf so far is an integer
  std::uint64_t prompt_tokens_ = 0;
  bool messages_seen_ = false;
  std::uint64_t messages_tokens_ = 0;
  std::uint64_t content_tokens_ = 0;  // of the message being read, committed at its end (last "content" wins)
  std::uint64_t part_tokens_ = 0;     // of the part being read, committed at its end (last "text" wins)
  std::optional<std::uint32_t> max_tokens_, max_completion_tokens_;
  const bool chain_;  // build the prefix chain
  balancer::prefix_chain_builder prefix_;
  void feed(std::string_view s) {
    if (chain_) prefix_.feed(s);
  }
  // The first prompt's token ids, as the engine will cache them: a flat "prompt": [ids], or the first
  // array of a batch [[ids], ...]. An id beyond 32 bits, anything but an id, or ids and arrays of ids mixed at
  // the top (which vLLM refuses) make them unusable.
  std::vector<std::uint32_t> ids_;
  bool ids_usable_ = true;
  std::size_t id_arrays_ = 0;  // arrays of ids entered in the batch
  bool flat_ids_ = false;      // an id seen at the top of the prompt array
  void keep_id(const whole_number& n, bool in_batch) {
    if (!chain_) return;
    if (!in_batch) {
      flat_ids_ = true;
      if (id_arrays_ > 0) ids_usable_ = false;
    }
    if (in_batch && id_arrays_ != 1) return;
    if (n.negative || n.magnitude > std::numeric_limits<std::uint32_t>::max()) {
      ids_usable_ = false;
      return;
    }
    if (ids_.size() < max_prompt_token_ids) ids_.push_back(static_cast<std::uint32_t>(n.magnitude));
  }
  void feed_id(std::uint64_t id) {
    if (!chain_) return;
    const auto narrow = static_cast<std::uint32_t>(id);
    feed(std::string_view(reinterpret_cast<const char*>(&narrow), sizeof narrow));
  }
  void separate() {
    if (chain_) prefix_.separate();
  }
};

place facts_handler::take_place() {
  if (skipped_ > 0) return place::other;
  if (depth_ == 0) return place::root;
  switch (frames_[depth_ - 1]) {
    case frame::prompt_batch: return place::prompt_item;
    case frame::prompt_ids: return place::prompt_id;
    case frame::messages: return place::message;
    case frame::parts: return place::part;
    case frame::top:
    case frame::message:
    case frame::part: return std::exchange(after_key_, place::other);
  }
  return place::other;
}

// A literal or a fraction: read nowhere, but in a prompt array it makes the count an estimate.
bool facts_handler::leaf() {
  const place p = take_place();
  if (p == place::prompt_item || p == place::prompt_id) prompt_ids_only_ = false;
  return true;
}

bool facts_handler::integer(whole_number n) {
  const place p = take_place();
  switch (p) {
    case place::max_tokens:
    case place::max_completion_tokens:
      if (!n.negative) (p == place::max_tokens ? max_tokens_ : max_completion_tokens_) = clamp_u32(n.magnitude);
      break;
    case place::choices:
      if (!n.negative && n.magnitude >= 1) facts_.choices = clamp_u32(std::min<std::uint64_t>(n.magnitude, max_choices));
      break;
    case place::data_parallel_rank: facts_.data_parallel_rank = n.as_int64(); break;
    case place::priority: facts_.priority = n.as_int64(); break;
    case place::prompt_item:
    case place::prompt_id:
      ++prompt_tokens_;
      if (!n.negative) feed_id(n.magnitude);
      keep_id(n, p == place::prompt_id);
      break;
    default: break;
  }
  return true;
}

bool facts_handler::string(std::string_view s) {
  const place p = take_place();
  switch (p) {
    case place::model: facts_.model = s; break;
    case place::cache_salt:
      if (chain_) facts_.cache_salt = s;
      break;
    case place::prompt:
      prompt_tokens_ = estimate_tokens(s);
      feed(s);
      break;
    case place::prompt_item:
      prompt_tokens_ += estimate_tokens(s);
      prompt_ids_only_ = false;
      feed(s);
      separate();
      break;
    case place::prompt_id: prompt_ids_only_ = false; break;
    case place::content:
      content_tokens_ = estimate_tokens(s);
      if (!prompt_seen_) feed(s);  // a "prompt" wins over "messages"
      break;
    case place::part_text:
      part_tokens_ = estimate_tokens(s);
      if (!prompt_seen_) feed(s);
      break;
    default: break;
  }
  return true;
}

// A key of one of the objects walked into: says where its value goes, and clears what an earlier
// occurrence of the same key set (the last one wins).
bool facts_handler::key(std::string_view k) {
  if (skipped_ > 0 || depth_ == 0) return true;
  switch (frames_[depth_ - 1]) {
    case frame::top:
      after_key_ = top_level_place(k);
      switch (after_key_) {
        case place::model: facts_.model.clear(); break;
        case place::prompt:
          prompt_seen_ = true;
          prompt_ids_only_ = false;
          prompt_tokens_ = 0;
          prefix_.take();  // the last "prompt" wins, and "prompt" wins over "messages"
          ids_.clear();
          ids_usable_ = true;
          id_arrays_ = 0;
          flat_ids_ = false;
          break;
        case place::messages:
          messages_seen_ = true;
          messages_tokens_ = 0;
          if (!prompt_seen_) prefix_.take();
          break;
        case place::max_tokens: max_tokens_.reset(); break;
        case place::max_completion_tokens: max_completion_tokens_.reset(); break;
        case place::choices: facts_.choices = 1; break;
        case place::data_parallel_rank: facts_.data_parallel_rank.reset(); break;
        case place::priority:
          facts_.priority.reset();
          facts_.has_priority_key = true;
          break;
        case place::cache_salt: facts_.cache_salt.clear(); break;
        default: break;
      }
      break;
    case frame::message:
      after_key_ = k == "content" ? place::content : place::other;
      if (after_key_ == place::content) content_tokens_ = 0;
      break;
    case frame::part:
      after_key_ = k == "text" ? place::part_text : place::other;
      if (after_key_ == place::part_text) part_tokens_ = 0;
      break;
    default: break;  // keys only occur in objects, and the only objects walked into are above
  }
  return true;
}

bool facts_handler::start_object() {
  const place p = take_place();
  if (p == place::root) {
    object_ = true;
    return enter(frame::top);
  }
  if (p == place::message) {
    content_tokens_ = 0;
    return enter(frame::message);
  }
  if (p == place::part) {
    part_tokens_ = 0;
    return enter(frame::part);
  }
  if (p == place::prompt_item || p == place::prompt_id) prompt_ids_only_ = false;
  return skip();
}

bool facts_handler::start_array() {
  switch (take_place()) {
    case place::root: return false;  // not an object: nothing to read, stop here
    case place::prompt:
      prompt_ids_only_ = true;
      return enter(frame::prompt_batch);
    case place::prompt_item:
      ++id_arrays_;
      if (flat_ids_) ids_usable_ = false;
      return enter(frame::prompt_ids);
    case place::prompt_id: prompt_ids_only_ = false; return skip();
    case place::messages: return enter(frame::messages);
    case place::content: return enter(frame::parts);
    default: return skip();
  }
}

bool facts_handler::end_object() {
  if (skipped_ == 0 && depth_ > 0) {
    if (frames_[depth_ - 1] == frame::message) {
      messages_tokens_ += content_tokens_;
      if (!prompt_seen_) separate();
    }
    if (frames_[depth_ - 1] == frame::part) content_tokens_ += part_tokens_;
  }
  return leave();
}

bool facts_handler::enter(frame f) {
  frames_[depth_++] = f;  // the frames nest at most max_frames deep by construction
  after_key_ = place::other;
  return true;
}

bool facts_handler::skip() {
  ++skipped_;
  return true;
}

bool facts_handler::leave() {
  if (skipped_ > 0) --skipped_;
  else if (depth_ > 0) --depth_;
  return true;
}

request_facts facts_handler::result() && {
  if (!object_) return {};
  facts_.json_object = true;
  if (prompt_seen_) {
    facts_.prompt_tokens = clamp_u32(prompt_tokens_);
    facts_.prompt_tokens_exact = prompt_ids_only_;
  } else if (messages_seen_) {
    facts_.prompt_tokens = clamp_u32(messages_tokens_);
  }
  facts_.max_tokens = max_completion_tokens_ ? max_completion_tokens_ : max_tokens_;
  if (chain_ && prompt_seen_ && prompt_ids_only_ && ids_usable_) facts_.prompt_token_ids = std::move(ids_);
  if (chain_ && (prompt_seen_ || messages_seen_)) {
    facts_.prefix_chain = prefix_.take();
    balancer::prefix_chain_builder::reseed(facts_.prefix_chain, balancer::prefix_chain_builder::seed_of(facts_.model));
  }
  return std::move(facts_);
}

}  // namespace

priority_body body_with_priority(std::string_view body, const request_facts& facts, std::int64_t priority) {
  priority_body out;
  if (!facts.json_object) return out;
  if (facts.has_priority_key ? facts.priority == priority : priority == 0) return out;
  if (!facts.has_priority_key) {
    // Added before the closing brace: every byte before it stays the client's. (A JSON object: the reader
    // checked it, so its last non-blank byte is its '}'.)
    const auto close = body.find_last_of('}');
    const auto last_inside = body.find_last_not_of(" \t\r\n", close - 1);
    const bool empty = body[last_inside] == '{';
    out.body.reserve(body.size() + 32);
    out.body.append(body.substr(0, close));
    out.body += empty ? "\"priority\":" : ",\"priority\":";
    out.body += std::to_string(priority);
    out.body.append(body.substr(close));
    out.result = priority_body::outcome::rewritten;
    return out;
  }
  // nlohmann's parse and dump recurse once per level: a body is bounded before it gets there.
  out.result = priority_body::outcome::unusable;
  if (support::json_nesting_depth(body, max_rewritten_depth) > max_rewritten_depth) return out;
  auto tree = nlohmann::ordered_json::parse(body, nullptr, false);
  if (!tree.is_object()) return out;
  tree["priority"] = priority;
  out.body = tree.dump();
  out.result = priority_body::outcome::rewritten;
  return out;
}

request_facts inspect_request_body(std::string_view body, bool prefix_chain) noexcept {
  try {
    facts_handler handler(prefix_chain);
    if (!json::reader(body).read(handler)) return {};
    return std::move(handler).result();
  } catch (...) {
    return {};  // allocation failure: nothing known
  }
}

}  // namespace dplb::server
