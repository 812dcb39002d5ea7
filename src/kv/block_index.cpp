#include "dplb/kv/block_index.hpp"

#include <algorithm>

namespace dplb::kv {

namespace block_index_detail {

bool is_gpu(std::string_view medium) {
  // vLLM writes "GPU"; any spelling of it is the GPU cache.
  return medium.size() == medium_gpu.size() &&
         std::equal(medium.begin(), medium.end(), medium_gpu.begin(),
                    [](char a, char b) { return (a >= 'a' && a <= 'z' ? a - 'a' + 'A' : a) == b; });
}

// Only the full-attention group's blocks make a prefix reusable as a whole; absent means the only group.
template <class Event>
bool indexed(const Event& e) {
  return is_gpu(e.medium) && (!e.group_idx || *e.group_idx == 0);
}

}  // namespace block_index_detail

block_index::rank_state* block_index::rank_at(std::size_t rank) {
  if (rank >= max_ranks) return nullptr;
  if (rank >= ranks_.size()) ranks_.resize(rank + 1);
  return &ranks_[rank];
}

void block_index::apply(std::size_t rank, const event_batch& batch, apply_counts& counts) {
  for (const kv_event& e : batch.events) apply(rank, e, counts);
}

void block_index::apply(std::size_t rank, const kv_event& event, apply_counts& counts) {
  if (rank >= max_ranks) {
    ++counts.ignored;
    return;
  }
  if (const auto* stored = std::get_if<block_stored>(&event)) {
    if (!block_index_detail::indexed(*stored)) {
      ++counts.ignored;
      return;
    }
    store(rank, *stored, counts);
  } else if (const auto* removed = std::get_if<block_removed>(&event)) {
    if (!block_index_detail::indexed(*removed)) {
      ++counts.ignored;
      return;
    }
    rank_state* r = rank_at(rank);
    for (const engine_block_key key : removed->block_hashes) {
      const auto it = r->by_key.find(key);
      if (it != r->by_key.end()) erase(it->second);
    }
    ++counts.applied;
  } else {
    clear_rank(rank);
    ++counts.applied;
  }
}

void block_index::store(std::size_t rank, const block_stored& event, apply_counts& counts) {
  rank_state* r = rank_at(rank);
  const std::size_t blocks = event.block_hashes.size();
  // The decoder checked these; an event built otherwise that disagrees is placed nowhere.
  if (event.block_size == 0 || event.token_ids.size() != blocks * event.block_size ||
      (event.extra_keys && event.extra_keys->size() != blocks)) {
    ++counts.ignored;
    return;
  }
  chain_hash parent = 0;
  if (event.parent_block_hash) {
    const auto it = r->by_key.find(*event.parent_block_hash);
    if (it == r->by_key.end()) {
      ++counts.unplaced;
      return;
    }
    parent = nodes_[it->second].hash;
  } else if (event.lora_name) {
    parent = chain_seed(*event.lora_name);
  } else if (event.lora_id) {
    parent = lora_seed_of_id(*event.lora_id);
  } else {
    parent = chain_seed({});
  }
  scratch_.clear();
  const std::span<const token_id> tokens(event.token_ids);
  for (std::size_t i = 0; i < blocks; ++i) {
    const std::uint64_t extra = event.extra_keys ? (*event.extra_keys)[i] : 0;
    parent = block_hash(parent, tokens.subspan(i * event.block_size, event.block_size), extra);
    scratch_.push_back(parent);
  }
  // Last block first, so that the run's head is its most recently stored block and is dropped last.
  for (std::size_t i = blocks; i-- > 0;) insert(rank, event.block_hashes[i], scratch_[i], counts);
  ++counts.applied;
}

void block_index::insert(std::size_t rank, engine_block_key key, chain_hash hash, apply_counts& counts) {
  rank_state& r = ranks_[rank];
  // Stored again under a key this rank already has (an engine that re-stores without a removal we saw):
  // the new content replaces the old.
  if (const auto it = r.by_key.find(key); it != r.by_key.end()) erase(it->second);
  if (capacity_ == 0) {
    ++counts.dropped_blocks;
    return;
  }
  if (r.count >= capacity_) {
    erase(r.oldest);
    ++counts.dropped_blocks;
  }
  std::uint32_t id = none;
  if (!free_nodes_.empty()) {
    id = free_nodes_.back();
    free_nodes_.pop_back();
  } else if (nodes_.size() < none) {
    id = static_cast<std::uint32_t>(nodes_.size());
    nodes_.emplace_back();
  } else {
    ++counts.dropped_blocks;
    return;
  }
  node& n = nodes_[id];
  n = node{};
  n.hash = hash;
  n.key = key;
  n.rank = static_cast<std::uint32_t>(rank) & ((std::uint32_t{1} << (32 - generation_bits)) - 1);
  n.generation = r.generation;
  n.older = r.newest;
  if (r.newest != none) nodes_[r.newest].newer = id;
  r.newest = id;
  if (r.oldest == none) r.oldest = id;
  ++r.count;
  r.by_key.emplace(key, id);
  const auto [holder, fresh] = first_holder_.try_emplace(hash, id);
  if (!fresh) {
    n.next_holder = holder->second;
    holder->second = id;
  }
}

void block_index::erase(std::uint32_t id) {
  node& n = nodes_[id];
  rank_state& r = ranks_[n.rank];
  (n.newer != none ? nodes_[n.newer].older : r.newest) = n.older;
  (n.older != none ? nodes_[n.older].newer : r.oldest) = n.newer;
  --r.count;
  r.by_key.erase(n.key);
  unlink_and_free(id);
}

void block_index::unlink_and_free(std::uint32_t id) {
  node& n = nodes_[id];
  const auto holder = first_holder_.find(n.hash);
  if (holder != first_holder_.end()) {
    if (holder->second == id) {
      if (n.next_holder == none) first_holder_.erase(holder);
      else holder->second = n.next_holder;
    } else {
      for (std::uint32_t prev = holder->second; prev != none; prev = nodes_[prev].next_holder) {
        if (nodes_[prev].next_holder == id) {
          nodes_[prev].next_holder = n.next_holder;
          break;
        }
      }
    }
  }
  n = node{};
  free_nodes_.push_back(id);
}

void block_index::clear_rank(std::size_t rank) {
  if (rank >= ranks_.size()) return;
  rank_state& r = ranks_[rank];
  if (r.newest == none) return;
  if (retired_.size() >= max_retired_lists) {
    while (collect(SIZE_MAX)) {
    }
  }
  retired_.push_back(r.newest);
  retired_keys_.push_back(std::move(r.by_key));
  r.by_key = key_map();
  r.newest = none;
  r.oldest = none;
  r.count = 0;
  r.generation = (r.generation + 1) & ((std::uint32_t{1} << generation_bits) - 1);
}

bool block_index::collect(std::size_t max_blocks) {
  for (std::size_t done = 0; !retired_.empty() && done < max_blocks; ++done) {
    const std::uint32_t id = retired_.back();
    const std::uint32_t older = nodes_[id].older;
    unlink_and_free(id);
    if (older == none) retired_.pop_back();
    else retired_.back() = older;
  }
  return !retired_.empty();
}

void block_index::take_retired_key_maps(std::vector<key_map>& out) {
  for (auto& keys : retired_keys_) out.push_back(std::move(keys));
  retired_keys_.clear();
}

void block_index::match(std::span<const chain_hash> chain, std::size_t ranks, std::vector<std::uint32_t>& matched) const {
  matched.assign(ranks, 0);
  for (std::size_t i = 0; i < chain.size(); ++i) {
    const auto it = first_holder_.find(chain[i]);
    if (it == first_holder_.end()) return;
    bool extended = false;
    // A rank extends its match only if it held every block before this one; a rank holding the same
    // content twice (under two engine hashes) is seen twice and extends once.
    for (std::uint32_t id = it->second; id != none; id = nodes_[id].next_holder) {
      const node& n = nodes_[id];
      const std::uint32_t r = n.rank;
      if (r < ranks && matched[r] == i && live(n)) {
        matched[r] = static_cast<std::uint32_t>(i + 1);
        extended = true;
      }
    }
    if (!extended) return;
  }
}

}  // namespace dplb::kv
