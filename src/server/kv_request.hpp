#pragma once
// A request's prompt as the engines' KV-cache events see it (prefix-aware with events), apart from the
// session that serves it: the model and cache_salt that seed its chain, whether its text must still be
// tokenized by an engine (--tokenize engine), and the chain of --block-size blocks the pick looks up. The
// chain is hashed here, on the worker, outside every lock; the pick only matches it.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "dplb/kv/chain_hash.hpp"
#include "dplb/server/proxy_context.hpp"
#include "dplb/server/request_facts.hpp"
#include "dplb/upstream/http_fetch.hpp"
#include "prompt_tokens.hpp"

namespace dplb::server {

class kv_request {
 public:
  // /tokenize's answer for the longest prompt dplb matches (max_prompt_token_ids ids of up to 10 digits).
  static constexpr std::size_t max_tokenize_answer_bytes = 16u << 20;

  // From the body's facts, for a request whose pick matches the events (`matched`: a prefix-aware pick of its
  // rank or of its prefill rank, or its decode rank's holdings for a skipped prefill) while some rank
  // publishes events: a prompt of token ids is chained at once; text waits for tokenize() under --tokenize
  // engine.
  void prepare(request_facts& facts, const shared_state& shared, balancer::pick_context& request, bool matched) {
    if (shared.kv_events == nullptr || !shared.kv_events->any_configured() || !matched) {
      return;  // only a prefix-aware pick (or a skip) matches the events (least-tokens reads the body too)
    }
    model_ = std::move(facts.model);
    salt_ = std::move(facts.cache_salt);
    if (!facts.prompt_token_ids.empty()) {
      chain(facts.prompt_token_ids, shared, request);
    } else {
      tokenize_ = shared.settings.tokenize == config::tokenize_mode::engine && facts.json_object;
    }
  }

  bool awaits_tokens() const { return tokenize_; }

  // The share of the request's prompt blocks (`request.kv_chain`, set once its tokens are known) that
  // `rank`'s KV-cache events say the rank holds, from the first block on; 0 without a chain.
  static double share_held_by(std::size_t rank, const balancer::pick_context& request, const shared_state& shared) {
    if (request.kv_chain.empty() || shared.kv_events == nullptr) return 0;
    std::vector<std::uint32_t> matched;
    shared.kv_events->match(request.kv_chain, shared.topology.ranks().size(), matched);
    return rank < matched.size() ? static_cast<double>(matched[rank]) / static_cast<double>(request.kv_chain.size()) : 0;
  }

  // Whether some usable rank of the request's cluster holds at least `share` of its prompt blocks (as
  // share_held_by counts them); false without a chain.
  static bool some_rank_holds(double share, const balancer::pick_context& request, const shared_state& shared) {
    if (request.kv_chain.empty() || shared.kv_events == nullptr) return false;
    std::vector<std::uint32_t> matched;
    shared.kv_events->match(request.kv_chain, shared.topology.ranks().size(), matched);
    const auto chain = static_cast<double>(request.kv_chain.size());
    for (const auto& r : shared.topology.ranks()) {
      if (r.cluster != request.cluster || r.rank >= matched.size() || !shared.balancer.usable(r.rank)) continue;
      if (static_cast<double>(matched[r.rank]) / chain >= share) return true;
    }
    return false;
  }

  // --tokenize engine: the token ids of a text prompt or of chat messages, from vLLM's POST /tokenize on an
  // engine of the request's cluster (any: they share the tokenizer and the template). On any failure the
  // request goes on without them, matched by the approximate index, and the failure is counted.
  io::task<void> tokenize(std::string_view body, const shared_state& shared, balancer::pick_context& request) {
    tokenize_ = false;
    const auto tokenize_body = tokenize_request_body(body);
    const upstream::backend* engine = tokenize_body ? tokenizer_for(shared, request) : nullptr;
    if (engine == nullptr) co_return;
    const auto answer = co_await upstream::post_json(*engine, "/tokenize", *tokenize_body, "dplb-tokenize",
                                                     2 * shared.settings.health_check_timeout,
                                                     max_tokenize_answer_bytes);
    std::optional<std::vector<std::uint32_t>> tokens;
    if (answer && answer->status == 200) tokens = tokens_of_tokenize_answer(answer->body, max_prompt_token_ids);
    shared.metrics.tokenized(tokens.has_value());
    if (tokens) chain(*tokens, shared, request);
  }

 private:
  // The prompt's chain of blocks, as the events index them; `request` points at it for the pick (and its
  // wait in the queue: the chain lives as long as this object, the session's).
  void chain(std::span<const std::uint32_t> tokens, const shared_state& shared, balancer::pick_context& request) {
    const bool adapter = shared.kv_events->is_adapter(model_);
    kv::request_chain(tokens, shared.settings.block_size, adapter ? std::string_view(model_) : std::string_view(),
                      salt_, max_prompt_token_ids, chain_);
    request.kv_chain = chain_;
  }

  // The engine server that tokenizes for the request: its pinned rank's (if usable), else a usable rank's of
  // its cluster, taking turns (per worker thread) so that no one engine tokenizes for all.
  static const upstream::backend* tokenizer_for(const shared_state& shared, const balancer::pick_context& request) {
    static thread_local std::size_t next = 0;
    const auto ranks = shared.topology.ranks();
    const auto backends = shared.topology.backends();
    if (request.pinned_rank && shared.balancer.usable(*request.pinned_rank)) {
      return &backends[ranks[*request.pinned_rank].backend];
    }
    for (std::size_t step = 0; step < ranks.size(); ++step) {
      const auto& r = ranks[(next + step) % ranks.size()];
      if (r.cluster == request.cluster && shared.balancer.usable(r.rank)) {
        next = r.rank + 1;
        return &backends[r.backend];
      }
    }
    return nullptr;
  }

  std::string model_;
  std::string salt_;
  bool tokenize_ = false;
  std::vector<std::uint64_t> chain_;
};

}  // namespace dplb::server
