#pragma once
// The one KV-cache event index of a dplb process, shared by the thread that reads the engines' events
// (event_subscriber.hpp) and every worker that picks a rank: a block_index behind a lock, and per rank
// the feed's counters, which the metrics and the status page read without taking the lock.
//
// Threading contract: every member may be called from any thread. apply() takes the lock for one event at a
// time (microseconds); clearing a rank (clear_rank(), or an AllBlocksCleared event) takes it once to retire
// the rank's blocks (O(1)), then frees them in slices of collect_slice_blocks (tens of microseconds each), letting a
// waiting lookup in between, and frees the rank's key map without it; match() takes it for one lookup (about
// 2 us for an 8,000-token prompt against a million blocks). Lock order: the balancer's lock, then this one
// (a policy matches while the balancer holds its own); nothing here calls out while holding it.

#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string_view>
#include <vector>

#include <boost/unordered/unordered_flat_set.hpp>
#include <string>

#include "dplb/kv/block_index.hpp"
#include "dplb/kv/kv_event.hpp"

namespace dplb::kv {

// Why a rank's index was dropped whole (dplb_kv_index_resets_total{reason}). Stable names: alerts use them.
enum class reset_reason : std::uint8_t {
  gap,        // a sequence gap that no replay filled: batches were lost
  restart,    // the publisher's sequence went back: the engine restarted with an empty cache
  unhealthy,  // the rank failed its health checks: its engine may be gone or restarting
  removed,    // the backend was removed, or its event source changed
  disconnect, // the publisher's connection dropped: what follows may be another engine's
};
inline constexpr std::size_t reset_reason_count = 5;
constexpr std::string_view name_of(reset_reason r) {
  constexpr std::string_view names[reset_reason_count] = {"gap", "restart", "unhealthy", "removed", "disconnect"};
  return names[static_cast<std::size_t>(r)];
}

// One rank's feed, as the metrics show it. Written under the index's lock (or by the subscriber's thread),
// read by anyone.
struct rank_feed {
  std::atomic<bool> configured{false};      // the rank has an event source (its backend's #kv-events=)
  // A batch of its events has been read since it was configured: until then, the events are no evidence of
  // what it holds (a publisher that was never reached, or has not published yet), and prefix-aware keeps
  // its approximate index for its cluster.
  std::atomic<bool> heard{false};
  std::atomic<std::uint64_t> events{0};     // events read from its batches and applied (dplb_kv_events_total)
  std::atomic<std::uint64_t> errors{0};     // events or whole messages skipped (dplb_kv_event_errors_total)
  std::atomic<std::uint64_t> blocks{0};     // blocks indexed now (dplb_kv_blocks)
  std::atomic<std::uint64_t> replayed{0};   // batches recovered from the replay socket after a gap
  std::array<std::atomic<std::uint64_t>, reset_reason_count> resets{};
  // The engine's timestamp of the last batch applied and when it arrived (system clock, seconds since the
  // epoch, as the engine writes it): their difference is the event lag (0 before any batch).
  std::atomic<double> last_batch_ts{0};
  std::atomic<double> last_batch_arrival{0};
};

class event_index {
 public:
  // `blocks_per_rank`: --kv-index-blocks. `capacity`: the most ranks there will ever be (the topology's).
  event_index(std::size_t blocks_per_rank, std::size_t capacity);

  // Applies one batch of a rank's events, in order, and counts them: every event of the batch that was read
  // (applied, or ignored by rule: another medium or KV cache group) counts in `events`, every skipped one
  // (unknown type, wrong shape) in `errors`. `arrival`: when the message arrived (system clock seconds); a
  // replayed batch (`live` false) leaves the lag alone, as it is old by nature.
  void apply(std::size_t rank, const decode_result& decoded, double arrival, bool live = true);
  // A message that could not be read at all (not msgpack, not an EventBatch, a bad sequence frame).
  void count_unreadable(std::size_t rank);
  // Drops everything a rank holds, and counts why.
  void clear_rank(std::size_t rank, reset_reason why);
  void count_replayed(std::size_t rank, std::size_t batches);

  // As block_index::match, under the lock. Ranks at or beyond the capacity match nothing.
  void match(std::span<const chain_hash> chain, std::size_t ranks, std::vector<std::uint32_t>& matched) const;

  // Whether `model` names a LoRA adapter some engine stored blocks for (a BlockStored's lora_name): a
  // request for it is then matched on the adapter's chain, else on the base model's. dplb cannot tell an
  // adapter's name from the base model's otherwise; the first blocks of an adapter teach it.
  bool is_adapter(std::string_view model) const;

  // Whether some rank has an event source: a policy uses the events only then.
  bool any_configured() const noexcept { return configured_count_.load(std::memory_order_relaxed) > 0; }
  void set_configured(std::size_t rank, bool on);

  std::size_t capacity() const noexcept { return capacity_; }
  // nullptr beyond the capacity.
  const rank_feed* feed(std::size_t rank) const noexcept { return rank < capacity_ ? &feeds_[rank] : nullptr; }

 private:
  void publish_blocks_locked(std::size_t rank);
  // Frees what clearing a rank retired, a slice per hold of the lock.
  void collect_retired();
  static constexpr std::size_t collect_slice_blocks = 256;
  // Lookups waiting for the lock (or about to take it), and lookups that took it: a collection lets those
  // waiting in between two slices, and knows one got in when the second count moves.
  mutable std::atomic<int> lookups_waiting_{0};
  mutable std::atomic<std::uint64_t> lookups_entered_{0};
  // The longest a collection waits, between two slices, for a waiting lookup to take the lock.
  static constexpr std::chrono::microseconds lookup_turn_wait{500};

  const std::size_t capacity_;
  mutable std::mutex mutex_;
  block_index index_;  // guarded by mutex_
  // Adapter names seen in events, at most max_adapters (guarded by mutex_); any_adapter_ spares the lock
  // while there is none.
  static constexpr std::size_t max_adapters = 4096;
  boost::unordered_flat_set<std::string> adapters_;
  std::atomic<bool> any_adapter_{false};
  std::unique_ptr<rank_feed[]> feeds_;
  std::atomic<std::size_t> configured_count_{0};
};

}  // namespace dplb::kv
