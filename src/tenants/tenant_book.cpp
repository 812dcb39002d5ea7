#include "dplb/tenants/tenant_book.hpp"

#include <algorithm>
#include <limits>
#include <utility>

namespace dplb::tenants {

namespace {

std::optional<token_bucket> request_bucket(const tenant_state::limits& l) {
  if (!l.requests_per_second) return std::nullopt;
  return l.burst ? token_bucket(*l.requests_per_second, *l.burst) : token_bucket(*l.requests_per_second);
}

std::optional<token_bucket> token_bucket_of(const tenant_state::limits& l) {
  if (!l.tokens_per_minute) return std::nullopt;
  return token_bucket::per_minute(*l.tokens_per_minute);
}

// A bucket for new limits that starts where the old one stood: its units missing (a debt included) carried over.
void replace_bucket(std::optional<token_bucket>& bucket, std::optional<token_bucket> next,
                    token_bucket::clock::time_point now) {
  if (bucket && next && bucket->rate() == next->rate() && bucket->burst() == next->burst()) return;
  if (bucket && next) {
    if (const auto missing = bucket->missing(now)) next->charge(now, missing);
  }
  bucket = std::move(next);
}

std::int64_t seconds_since_epoch(tenant_state::clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::seconds>(t.time_since_epoch()).count();
}

}  // namespace

tenant_state::tenant_state(std::string name, std::uint64_t id) : name_(std::move(name)), id_(id) {
  limits_.name = name_;
}

tenant_state::limits tenant_state::current_limits() const {
  std::lock_guard lock(mutex_);
  return limits_;
}

tenant_state::queue_terms tenant_state::terms() const {
  std::lock_guard lock(mutex_);
  queue_terms out;
  out.weight = std::max<std::uint32_t>(1, limits_.weight);
  if (limits_.max_queued) out.max_queued = *limits_.max_queued;
  if (limits_.max_queue_wait) out.max_queue_wait = *limits_.max_queue_wait;
  return out;
}

std::uint64_t tenant_state::unbounded_reservation(std::uint64_t prompt, std::uint64_t most_generated) const {
  const std::uint64_t total = prompt + std::min(most_generated, std::numeric_limits<std::uint64_t>::max() - prompt);
  std::lock_guard lock(mutex_);
  if (!token_budget_) return total;
  return std::max(prompt, std::min(total, token_budget_->burst()));
}

verdict tenant_state::admit(clock::time_point now, std::uint64_t tokens) {
  if (!limited_.load(std::memory_order_relaxed)) {
    note_admitted(now);
    return {};
  }
  std::lock_guard lock(mutex_);
  // Both limits are checked before either is taken from, so that a refusal takes nothing.
  if (request_rate_) {
    if (const auto wait = request_rate_->retry_after(now, 1); wait && wait->count() > 0) {
      return {verdict::refusal::request_rate, retry_after_seconds(*wait)};
    }
  }
  if (token_budget_ && tokens > 0) {
    if (auto too_large = judge_size_locked(tokens); !too_large.admitted()) return too_large;
    const auto wait = token_budget_->retry_after(now, tokens);
    if (wait && wait->count() > 0) return {verdict::refusal::token_budget, retry_after_seconds(*wait)};
  }
  if (request_rate_) request_rate_->try_take(now, 1);
  if (token_budget_ && tokens > 0) token_budget_->try_take(now, tokens);
  note_admitted(now);
  return {};
}

tenant_state::shared_limits tenant_state::limits_to_share() const {
  std::lock_guard lock(mutex_);
  shared_limits out;
  if (request_rate_) out.requests = bucket_terms{request_rate_->rate(), request_rate_->burst()};
  if (token_budget_) out.tokens = bucket_terms{token_budget_->rate(), token_budget_->burst()};
  return out;
}

verdict tenant_state::judge_size(std::uint64_t tokens) const {
  std::lock_guard lock(mutex_);
  return judge_size_locked(tokens);
}

verdict tenant_state::judge_size_locked(std::uint64_t tokens) const {
  if (token_budget_ && tokens > token_budget_->burst()) {
    return {.why = verdict::refusal::larger_than_budget, .tokens = tokens, .budget = token_budget_->burst()};
  }
  return {};
}

void tenant_state::settle(clock::time_point now, std::uint64_t reserved, std::uint64_t used) {
  std::lock_guard lock(mutex_);
  if (!token_budget_) return;
  if (used < reserved) {
    token_budget_->give_back(reserved - used);
  } else if (used > reserved) {
    token_budget_->charge(now, used - reserved);
  }
}

void tenant_state::count_status(unsigned status) noexcept {
  by_status_[std::min<unsigned>(status, by_status_.size() - 1)].fetch_add(1, std::memory_order_relaxed);
}

void tenant_state::count_tokens(std::uint64_t prompt, std::uint64_t completion) noexcept {
  prompt_tokens_.fetch_add(prompt, std::memory_order_relaxed);
  completion_tokens_.fetch_add(completion, std::memory_order_relaxed);
}

void tenant_state::note_admitted(clock::time_point now) noexcept {
  const auto second = static_cast<std::uint64_t>(seconds_since_epoch(now));
  constexpr std::uint64_t count_mask = (std::uint64_t{1} << count_bits) - 1;
  auto& slot = admitted_[second % rate_window_seconds];
  auto seen = slot.load(std::memory_order_relaxed);
  for (;;) {
    // The slot still counts an older second: this second starts it anew.
    const auto next = (seen >> count_bits) != second ? (second << count_bits | 1)
                      : (seen & count_mask) == count_mask ? seen
                                                          : seen + 1;
    if (slot.compare_exchange_weak(seen, next, std::memory_order_relaxed)) return;
  }
}

double tenant_state::admitted_rate(clock::time_point now) const noexcept {
  const auto second = static_cast<std::uint64_t>(seconds_since_epoch(now));
  constexpr std::uint64_t count_mask = (std::uint64_t{1} << count_bits) - 1;
  std::uint64_t sum = 0;
  for (const auto& slot : admitted_) {
    const auto value = slot.load(std::memory_order_relaxed);
    const auto stamp = value >> count_bits;
    if (stamp <= second && second - stamp < rate_window_seconds) sum += value & count_mask;
  }
  return static_cast<double>(sum) / rate_window_seconds;
}

tenant_state::snapshot tenant_state::read(clock::time_point now) const {
  snapshot out;
  out.name = name_;
  {
    std::lock_guard lock(mutex_);
    out.limits = limits_;
  }
  out.requests_per_second = admitted_rate(now);
  out.queued = queued_.load(std::memory_order_relaxed);
  out.in_flight = in_flight_.load(std::memory_order_relaxed);
  out.prompt_tokens = prompt_tokens_.load(std::memory_order_relaxed);
  out.completion_tokens = completion_tokens_.load(std::memory_order_relaxed);
  for (unsigned status = 0; status < by_status_.size(); ++status) {
    if (const auto n = by_status_[status].load(std::memory_order_relaxed)) out.requests_by_status.emplace_back(status, n);
  }
  return out;
}

void tenant_state::apply(const limits& next, clock::time_point now) {
  std::lock_guard lock(mutex_);
  replace_bucket(request_rate_, request_bucket(next), now);
  replace_bucket(token_budget_, token_bucket_of(next), now);
  limits_ = next;
  has_token_budget_.store(token_budget_.has_value(), std::memory_order_relaxed);
  min_priority_.store(next.min_priority.value_or(std::numeric_limits<std::int64_t>::min()), std::memory_order_relaxed);
  limited_.store(request_rate_.has_value() || token_budget_.has_value(), std::memory_order_relaxed);
}

tenant_book::tenant_book(std::span<const tenant_spec> specs, tenant_state::clock::time_point now) {
  roster_.store(make_roster(specs, now));  // in the body: make_roster reads the members declared after roster_
}

std::shared_ptr<const tenant_book::roster> tenant_book::make_roster(std::span<const tenant_spec> specs,
                                                                   tenant_state::clock::time_point now) {
  tenant_directory directory(specs);  // throws for specs it refuses: nothing below has happened yet
  // Every limit's bucket is built before any tenant changes, so that a limit token_bucket refuses (a refill
  // of over a year) also changes nothing.
  for (const auto& t : directory.tenants()) {
    (void)request_bucket(t);
    (void)token_bucket_of(t);
  }
  std::vector<std::shared_ptr<tenant_state>> states;
  std::lock_guard lock(mutex_);
  for (const auto& t : directory.tenants()) {
    auto& state = known_[t.name];
    if (!state) state = std::make_shared<tenant_state>(t.name, next_id_++);
    state->apply(t, now);
    states.push_back(state);
  }
  return std::make_shared<const roster>(roster{std::move(directory), std::move(states)});
}

void tenant_book::reload(std::span<const tenant_spec> specs, tenant_state::clock::time_point now) {
  roster_.store(make_roster(specs, now));
}

std::shared_ptr<const tenant_book::roster> tenant_book::current() const { return roster_.load(); }

tenant_book::identity tenant_book::identify(std::string_view authorization, std::string_view tenant_header) const {
  const auto r = current();
  if (const auto by_key = r->directory.tenant_of_key(authorization)) return {r->states[*by_key], true};
  return {r->states[r->directory.tenant_by_header(tenant_header).value_or(tenant_directory::default_tenant)], false};
}

std::vector<std::shared_ptr<tenant_state>> tenant_book::tenants() const { return current()->states; }

std::vector<std::shared_ptr<tenant_state>> tenant_book::every_tenant() const {
  std::lock_guard lock(mutex_);
  std::vector<std::shared_ptr<tenant_state>> out;
  out.reserve(known_.size());
  for (const auto& [name, state] : known_) out.push_back(state);
  return out;
}

}  // namespace dplb::tenants
