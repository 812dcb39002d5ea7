#pragma once
// Private to the session: a request's standing with its tenant, from the moment its head names the tenant to
// its answer. It counts the request once, by the status the client got (dplb_tenant_requests_total), keeps it
// in its tenant's queued and in-flight counts while it is either, and settles its token reservation with what
// the engine reported using (in the shared ledger's budget when the ledger admitted it). The session keeps one
// for the request in progress; end() (also from the destructor) undoes whatever is still counted, so that no
// exit path leaves a count behind.

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "dplb/balancer/replica_ledger.hpp"
#include "dplb/tenants/tenant_book.hpp"

namespace dplb::server {

class tenant_pass {
 public:
  using clock_type = std::chrono::steady_clock;

  tenant_pass() = default;
  tenant_pass(const tenant_pass&) = delete;
  tenant_pass& operator=(const tenant_pass&) = delete;
  ~tenant_pass() { end(); }

  // A new request of `tenant` (the previous one's pass ends first).
  void begin(std::shared_ptr<tenants::tenant_state> tenant) {
    end();
    tenant_ = std::move(tenant);
  }
  explicit operator bool() const noexcept { return tenant_ != nullptr; }
  tenants::tenant_state& tenant() const noexcept { return *tenant_; }

  // Its tenant's request rate and token budget; admitted, `tokens` stay reserved from the budget until the
  // engine reports its usage (or the request ends). Other tenants are not affected. No tenant: admitted.
  tenants::verdict admit(std::uint64_t tokens) {
    if (!tenant_) return {};
    const auto verdict = tenant_->admit(clock_type::now(), tokens);
    if (verdict.admitted()) reserved_ = tokens;
    return verdict;
  }
  // Admitted by the buckets every replica shares (--shared-state) instead: `tokens` stay reserved in the
  // shared budget `budget` (none: the tenant has no token budget), and are settled there through `ledger`.
  void admitted_by_ledger(std::uint64_t tokens, balancer::replica_ledger& ledger,
                          std::optional<balancer::replica_ledger::bucket_spec> budget) {
    if (!tenant_) return;
    tenant_->count_admitted(clock_type::now());
    if (!budget) return;
    reserved_ = tokens;
    shared_budget_ = shared_budget{&ledger, std::move(*budget)};
  }
  // The prompt's tokens (estimated from the body): what a stream that reports no usage is charged besides
  // its events.
  void note_prompt(std::uint64_t prompt) noexcept { prompt_ = prompt; }
  // Whether its tokens are reckoned (a token budget reserved some): then a stream's events are counted.
  bool reckons_tokens() const noexcept { return tenant_ && reserved_ > 0; }

  // In dplb's queue, or out of it again.
  void set_queued(bool on) noexcept {
    if (!tenant_ || on == queued_) return;
    queued_ = on;
    tenant_->add_queued(on ? 1 : -1);
  }
  // Holding a slot on a rank, until answered().
  void holding_slot() noexcept {
    if (!tenant_ || in_flight_ || counted_) return;
    in_flight_ = true;
    tenant_->add_in_flight(1);
  }
  // An engine took the request: what it used counts against the budget even without a usage report.
  void reached_engine() noexcept { reached_engine_ = true; }
  // No engine will see the request: its reservation comes back now, before the client reads its answer (in the
  // shared budget, sent before the answer on this replica's connection to Redis: a retry through this replica
  // finds it there; one through another replica may come a round trip before it).
  void give_back_reservation() {
    if (!tenant_ || reserved_ == 0 || std::exchange(settled_, true)) return;
    settle(0);
  }

  // The client's answer: counted once (the first status given), and the request no longer holds a slot.
  void answered(unsigned status) noexcept {
    if (!tenant_) return;
    leave_slot();
    if (std::exchange(counted_, true)) return;
    tenant_->count_status(status);
  }
  // The engine's usage report: the tokens are counted, and the reservation settled with them.
  void used(std::uint64_t prompt, std::uint64_t completion) {
    if (!tenant_) return;
    tenant_->count_tokens(prompt, completion);
    if (!std::exchange(settled_, true)) settle(prompt + completion);
  }
  // Completion tokens streamed so far (the stream's events, counted as they pass): what a stream that
  // reports no usage is charged, with its prompt, when it ends or is cut short.
  void streamed(std::uint64_t completion) noexcept { streamed_ = completion; }
  // The engine finished without a usage report: a stream that sent tokens settles with them now, so that
  // what it did not use is back before the client reads its last bytes.
  void settle_streamed() {
    if (!tenant_ || reserved_ == 0 || streamed_ == 0 || std::exchange(settled_, true)) return;
    settle(prompt_ + streamed_);
  }

  // The request is over: whatever it still holds is given back. A reservation the engine never reported on
  // is charged what it streamed when it streamed, kept whole when an engine took the request otherwise (it
  // did the work), and comes back when none did.
  void end() {
    if (!tenant_) return;
    set_queued(false);
    leave_slot();
    if (reserved_ > 0 && !settled_) {
      const auto used = !reached_engine_ ? 0 : streamed_ > 0 ? prompt_ + streamed_ : reserved_;
      settle(used);
    }
    tenant_.reset();
    shared_budget_.reset();
    reserved_ = prompt_ = streamed_ = 0;
    counted_ = settled_ = reached_engine_ = false;
  }

 private:
  // The reservation corrected by what was used, in the budget it was taken from.
  void settle(std::uint64_t used) {
    if (!shared_budget_) {
      tenant_->settle(clock_type::now(), reserved_, used);
    } else if (used < reserved_) {
      shared_budget_->ledger->give_back(shared_budget_->bucket, reserved_ - used);
    } else if (used > reserved_) {
      shared_budget_->ledger->charge(shared_budget_->bucket, used - reserved_);
    }
  }
  void leave_slot() noexcept {
    if (std::exchange(in_flight_, false)) tenant_->add_in_flight(-1);
  }

  // The budget in the shared ledger the request was admitted by (none: its tenant's own buckets).
  struct shared_budget {
    balancer::replica_ledger* ledger;
    balancer::replica_ledger::bucket_spec bucket;
  };

  std::shared_ptr<tenants::tenant_state> tenant_;
  std::optional<shared_budget> shared_budget_;
  std::uint64_t reserved_ = 0;
  std::uint64_t prompt_ = 0;    // of the reservation
  std::uint64_t streamed_ = 0;  // completion tokens streamed (events), when no usage came
  bool queued_ = false;
  bool in_flight_ = false;
  bool counted_ = false;
  bool settled_ = false;
  bool reached_engine_ = false;
};

// What the client is told when its tenant's limits refused the request (by name: never by its key).
inline std::string tenant_refusal_text(const tenants::verdict& verdict, const std::string& tenant) {
  switch (verdict.why) {
    case tenants::verdict::refusal::request_rate:
      return "tenant '" + tenant + "' is over its requests_per_second; retry after the Retry-After seconds";
    case tenants::verdict::refusal::token_budget:
      return "tenant '" + tenant + "' is over its tokens_per_minute; retry after the Retry-After seconds";
    default:
      return "the request's " + std::to_string(verdict.tokens) + " tokens (its prompt and most generated: max_tokens, " +
             "times n) exceed tenant '" + tenant + "''s whole token budget, tokens_per_minute " +
             std::to_string(verdict.budget) + ", so it can never be admitted; lower max_tokens or shorten the prompt";
  }
}

// The OpenAI error code of a request larger than its tenant's whole token budget: a client error no retry
// cures, answered 400 without Retry-After (a 429 would be retried by SDKs, forever).
inline constexpr std::string_view request_too_large_code = "request_too_large";

}  // namespace dplb::server
