#include "dplb/kv/event_index.hpp"

#include <algorithm>
#include <thread>

namespace dplb::kv {

event_index::event_index(std::size_t blocks_per_rank, std::size_t capacity)
    : capacity_(std::min(capacity, block_index::max_ranks)),
      index_(blocks_per_rank),
      feeds_(std::make_unique<rank_feed[]>(capacity_)) {}

void event_index::apply(std::size_t rank, const decode_result& decoded, double arrival, bool live) {
  if (rank >= capacity_) return;
  rank_feed& feed = feeds_[rank];
  if (!decoded.ok()) {
    count_unreadable(rank);
    return;
  }
  // One event at a time under the lock: a pick (which waits for it holding the balancer's lock) waits for
  // one event at most, never for a whole batch.
  for (const kv_event& e : decoded.batch.events) {
    bool retired = false;
    {
      apply_counts counts;
      const std::lock_guard lock(mutex_);
      index_.apply(rank, e, counts);
      const auto* stored = std::get_if<block_stored>(&e);
      if (stored && stored->lora_name && !stored->lora_name->empty() && adapters_.size() < max_adapters &&
          adapters_.insert(*stored->lora_name).second) {
        any_adapter_.store(true, std::memory_order_relaxed);
      }
      publish_blocks_locked(rank);
      retired = index_.has_retired();
    }
    if (retired) collect_retired();  // an AllBlocksCleared
  }
  feed.heard.store(true, std::memory_order_relaxed);
  // Every event read counts as applied, those the index ignores by rule included (another medium, another
  // KV cache group, a stored run whose parent was dropped): they were valid and had their effect, none.
  feed.events.fetch_add(decoded.batch.events.size(), std::memory_order_relaxed);
  if (decoded.skipped_events() > 0) feed.errors.fetch_add(decoded.skipped_events(), std::memory_order_relaxed);
  if (live) {
    feed.last_batch_ts.store(decoded.batch.ts, std::memory_order_relaxed);
    feed.last_batch_arrival.store(arrival, std::memory_order_relaxed);
  }
}

void event_index::count_unreadable(std::size_t rank) {
  if (rank < capacity_) feeds_[rank].errors.fetch_add(1, std::memory_order_relaxed);
}

void event_index::clear_rank(std::size_t rank, reset_reason why) {
  if (rank >= capacity_) return;
  {
    const std::lock_guard lock(mutex_);
    index_.clear_rank(rank);
    publish_blocks_locked(rank);
  }
  collect_retired();
  feeds_[rank].resets[static_cast<std::size_t>(why)].fetch_add(1, std::memory_order_relaxed);
}

void event_index::collect_retired() {
  std::vector<block_index::key_map> key_maps;
  for (;;) {
    bool more = false;
    {
      const std::lock_guard lock(mutex_);
      more = index_.collect(collect_slice_blocks);
      index_.take_retired_key_maps(key_maps);
    }
    key_maps.clear();  // freed without the lock: a rank's map of 262,144 keys is a few MiB handed back
    if (!more) return;
    // A lookup waiting for the lock takes it between two slices rather than after the last. A mutex is not
    // fair: this thread, already running, would take it again before the woken lookup is scheduled (measured:
    // lookups due during a clear waited about the whole clear, ~30 ms), so it steps aside until one got in,
    // for at most lookup_turn_wait. (Not otherwise: the clear is on the events' only thread.)
    if (lookups_waiting_.load(std::memory_order_relaxed) > 0) {
      const auto entered = lookups_entered_.load(std::memory_order_relaxed);
      const auto until = std::chrono::steady_clock::now() + lookup_turn_wait;
      while (lookups_entered_.load(std::memory_order_relaxed) == entered && std::chrono::steady_clock::now() < until) {
        std::this_thread::yield();
      }
    }
  }
}

void event_index::count_replayed(std::size_t rank, std::size_t batches) {
  if (rank < capacity_) feeds_[rank].replayed.fetch_add(batches, std::memory_order_relaxed);
}

void event_index::match(std::span<const chain_hash> chain, std::size_t ranks, std::vector<std::uint32_t>& matched) const {
  lookups_waiting_.fetch_add(1, std::memory_order_relaxed);
  const std::lock_guard lock(mutex_);
  lookups_waiting_.fetch_sub(1, std::memory_order_relaxed);
  lookups_entered_.fetch_add(1, std::memory_order_relaxed);
  index_.match(chain, std::min(ranks, capacity_), matched);
  matched.resize(ranks, 0);
}

bool event_index::is_adapter(std::string_view model) const {
  if (model.empty() || !any_adapter_.load(std::memory_order_relaxed)) return false;
  const std::lock_guard lock(mutex_);
  return adapters_.contains(std::string(model));
}

void event_index::set_configured(std::size_t rank, bool on) {
  if (rank >= capacity_) return;
  if (!on) feeds_[rank].heard.store(false, std::memory_order_relaxed);  // a new source is heard anew
  if (feeds_[rank].configured.exchange(on, std::memory_order_relaxed) == on) return;
  if (on) {
    configured_count_.fetch_add(1, std::memory_order_relaxed);
  } else {
    configured_count_.fetch_sub(1, std::memory_order_relaxed);
  }
}

void event_index::publish_blocks_locked(std::size_t rank) {
  feeds_[rank].blocks.store(index_.blocks(rank), std::memory_order_relaxed);
}

}  // namespace dplb::kv
