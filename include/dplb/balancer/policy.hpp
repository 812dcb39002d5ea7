#pragma once
// The load-balancing policy interface. A policy only chooses; the balancer owns the counts.
//
// Threading contract: the balancer calls every member with its lock held, so a policy needs no
// synchronisation of its own and may keep state (a rotation cursor, a stats snapshot) in plain members.
// choose() must be fast and must not block: it runs once per request on the proxy's hot path.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

namespace dplb::balancer {

// One rank's load as its engine last reported it (vLLM's /metrics gauges).
struct engine_load {
  std::uint32_t waiting = 0;  // vllm:num_requests_waiting
  std::uint32_t running = 0;  // vllm:num_requests_running
  double kv_cache_usage = 0;  // vllm:kv_cache_usage_perc, 0..1
};

// What a rank's engine says of its load, as the policy may trust it.
struct engine_view {
  bool fresh = false;  // a good read newer than the staleness bound; else ignore the rest
  engine_load load{};  // at that read
  // The most of dplb's requests the engine can have counted in the read (in flight when it left, plus
  // every pick until it answered): what it reports beyond them is load dplb did not send (another dplb
  // replica, clients that bypass dplb).
  std::uint32_t inflight_at_read = 0;
};

// States that keep a rank out of rotation, as independent bits: the health checks, the outlier
// ejection and the admin API each set their own, so none of them can undo another's verdict.
enum rank_flag : std::uint8_t {
  unhealthy = 1,  // failed its active health checks
  ejected = 2,    // passive outlier detection took it out for a while
  draining = 4,   // the admin took it out: what is in flight finishes, nothing new starts
  removed = 8,    // no longer configured
};

// What a policy sees of one rank (one DP engine) when it chooses.
struct rank_view {
  std::uint32_t inflight = 0;       // requests dplb has sent to this rank and not yet finished
  std::uint64_t cost_inflight = 0;  // their cost in tokens (least-tokens), prompt parts released at first byte
  std::uint64_t prompt_inflight = 0;  // the prompt part of cost_inflight: prefill not yet done
  double weight = 1;                // configured weight, scaled down while the rank ramps up (slow start)
  std::uint8_t flags = 0;           // rank_flag bits
  bool usable = true;               // no flag, not avoided by this pick, below --max-inflight-per-rank
                                    // (policy::preferred: regardless of that limit)
  engine_view engine;
};

// What a policy may know of the request it places. The cost parts are filled only for a policy that
// asks for request facts (policy::needs_request_facts), since reading them means parsing the body.
struct pick_context {
  std::string_view model{};
  std::uint32_t prompt_tokens = 0;  // exact from token ids, else estimated from the text's length
  std::uint32_t decode_tokens = 0;  // the most tokens it may generate: max_tokens (or the default) times n
  std::string_view session_key{};  // --affinity-header's value; empty without one
  // The prompt's prefix blocks, chained by hash and seeded by the model (prefix_index.hpp); filled only
  // for a policy that asks for request facts.
  std::span<const std::uint64_t> prefix_chain{};
  // The prompt's blocks as the engines' KV-cache events index them (kv/chain_hash.hpp: token ids in
  // blocks of --block-size); empty when its token ids are not known. Filled only for prefix-aware.
  std::span<const std::uint64_t> kv_chain{};
  std::optional<std::size_t> pinned_rank{};  // the client named the rank: only it is a candidate
  std::size_t cluster = 0;  // the cluster serving the request: only its ranks are candidates
  const std::vector<bool>* avoid = nullptr;  // ranks already tried by this request (a retry)
  // A disaggregated request's decode leg: another rank prefills its prompt, so it never counts as a long
  // prompt on its own rank (balancer::queue_limits::long_prompt_tokens).
  bool prefilled_elsewhere = false;
};

// Where a request belongs (policy::preferred), and how much of its prompt that rank is known to hold.
struct place {
  std::size_t rank = 0;
  std::uint32_t matched_tokens = 0;
};

class policy {
 public:
  virtual ~policy() = default;

  // Returns the index of the rank to send the next request to, or nullopt when none is usable.
  // `ranks` is indexed by rank and holds the state just before this pick; a rank that is not usable
  // must never be chosen.
  virtual std::optional<std::size_t> choose(const pick_context& request, std::span<const rank_view> ranks) = 0;

  // Where the request belongs, whatever the load: the rank choose() would pick for what it knows of the
  // request (its prefix, say) if no rank were full, or nullopt when placement does not matter to this
  // policy (any rank with room is as good) or its place is over its load bound. The balancer asks it of a
  // queued request (--max-inflight-per-rank): a request with a place waits for that rank's next slot
  // instead of taking whichever rank frees first. `ranks` is as for choose(), except that a usable rank
  // may be full. Must not change what choose() does next (no rotation step, no index update, no counts).
  virtual std::optional<place> preferred(const pick_context& /*request*/, std::span<const rank_view> /*ranks*/) {
    return std::nullopt;
  }

  // The balancer gave the request the place preferred() named for it, without asking choose(): a waiter that
  // held out for its place takes that rank's freed slot (a step that reads no other rank, where choose()
  // reads them all). A policy that learns from its picks (an index of what it routed) learns this one too.
  virtual void placed(const pick_context& /*request*/, const place& /*at*/) {}

  // The name used on the command line and in logs, e.g. "round-robin".
  virtual std::string_view name() const noexcept = 0;

  // Policies fed by engine stats say so; every full snapshot (indexed by rank) is then also handed to
  // on_engine_stats(), besides being shown in each rank_view's engine part.
  virtual bool uses_engine_stats() const noexcept { return false; }
  // For a pick the shared ledger makes (--shared-state): the least this rank's load can be, in requests, by
  // what its engine reports; the ledger weighs max(every replica's requests, this). 0: nothing reported.
  virtual double engine_floor(const rank_view& /*rank*/) const noexcept { return 0; }
  virtual void on_engine_stats(std::span<const engine_load> /*snapshot*/) {}

  // A policy that needs the request's model and token counts says so; the session then reads them from
  // the body before the pick (a cost the count-based policies do not pay).
  virtual bool needs_request_facts() const noexcept { return false; }

  // Releases: off by default, since hearing them makes every release take the balancer's lock.
  virtual bool hears_releases() const noexcept { return false; }
  virtual void on_release(std::size_t /*rank*/) {}
  // A rank's flags changed (always heard: rare).
  virtual void on_state_change(std::size_t /*rank*/, std::uint8_t /*flags*/) {}
};

// Breaks ties between ranks a policy finds equally good. Equal weights: in rotation, starting just after
// the previous pick, so that equal ranks take turns (a burst onto idle ranks is exactly round-robin)
// instead of the lowest index winning every tie. Different weights: nginx's smooth weighted round-robin,
// each pick adding every candidate's weight to its credit and taking the one with the most (the first in
// rank order on a tie), which then pays the candidates' total; idle ranks of weights 2 and 1 take A B A,
// never A A B. A rank that is not a candidate keeps its credit.
class rotation {
 public:
  template <class IsCandidate>
  std::optional<std::size_t> pick(std::span<const rank_view> ranks, IsCandidate is_candidate) {
    const std::size_t n = ranks.size();
    const rank_view* first = nullptr;
    bool equal_weights = true;
    for (std::size_t i = 0; i < n; ++i) {
      if (!is_candidate(i)) continue;
      if (first && ranks[i].weight != first->weight) equal_weights = false;
      if (!first) first = &ranks[i];
    }
    if (!first) return std::nullopt;
    std::optional<std::size_t> chosen;
    if (equal_weights) {
      for (std::size_t step = 0; step < n && !chosen; ++step) {
        if (is_candidate((next_ + step) % n)) chosen = (next_ + step) % n;
      }
    } else {
      if (credit_.size() != n) credit_.assign(n, 0.0);
      double total = 0;
      for (std::size_t i = 0; i < n; ++i) {
        if (!is_candidate(i)) continue;
        credit_[i] += ranks[i].weight;
        total += ranks[i].weight;
        if (!chosen || credit_[i] > credit_[*chosen]) chosen = i;
      }
      credit_[*chosen] -= total;
    }
    next_ = (*chosen + 1) % n;
    return chosen;
  }

 private:
  std::size_t next_ = 0;
  std::vector<double> credit_;
};

// The candidate rank (usable, and accepted by `is_candidate`) with the lowest score; ties go to `ties`.
// Scores compare exactly: a policy's scores are ratios of whole numbers, and IEEE division rounds equal
// ratios to the same double.
template <class Score, class IsCandidate>
std::optional<std::size_t> lowest_score(std::span<const rank_view> ranks, rotation& ties, Score score,
                                        IsCandidate is_candidate) {
  const auto candidate = [&](const rank_view& h) { return h.usable && is_candidate(h); };
  std::optional<double> lowest;
  for (const auto& h : ranks) {
    if (candidate(h) && (!lowest || score(h) < *lowest)) lowest = score(h);
  }
  if (!lowest) return std::nullopt;
  return ties.pick(ranks, [&](std::size_t i) { return candidate(ranks[i]) && score(ranks[i]) == *lowest; });
}

// The usable rank with the lowest score; ties go to `ties`.
template <class Score>
std::optional<std::size_t> lowest_score(std::span<const rank_view> ranks, rotation& ties, Score score) {
  return lowest_score(ranks, ties, score, [](const rank_view&) { return true; });
}

}  // namespace dplb::balancer
