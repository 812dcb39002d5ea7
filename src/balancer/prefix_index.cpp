#include "dplb/balancer/prefix_index.hpp"

#include <algorithm>
#include <cstring>

#include "dplb/support/hashing.hpp"

namespace dplb::balancer {
using support::mix64;

void prefix_chain_builder::feed(std::string_view bytes) {
  while (!bytes.empty() && chain_.size() < max_prefix_blocks) {
    const std::size_t take = std::min(bytes.size(), prefix_block_bytes - filled_);
    std::memcpy(block_.data() + filled_, bytes.data(), take);
    filled_ += take;
    bytes.remove_prefix(take);
    if (filled_ == prefix_block_bytes) close_block();
  }
}

// Whole blocks are hashed, so a chain does not depend on how its prompt was cut into pieces.
void prefix_chain_builder::close_block() {
  std::uint64_t state = mix64(parent_);
  for (std::size_t at = 0; at < prefix_block_bytes; at += 8) {
    std::uint64_t word = 0;
    std::memcpy(&word, block_.data() + at, 8);
    state = mix64(state ^ word);
  }
  chain_.push_back(state);
  parent_ = state;
  filled_ = 0;
}

std::vector<prefix_hash> prefix_chain_builder::take(prefix_hash seed) {
  std::vector<prefix_hash> out = std::move(chain_);
  chain_.clear();
  parent_ = seed;
  filled_ = 0;
  return out;
}

prefix_hash prefix_chain_builder::seed_of(std::string_view model) {
  return support::hash_bytes(model);
}

void prefix_chain_builder::reseed(std::vector<prefix_hash>& chain, prefix_hash seed) {
  if (seed == 0) return;
  for (auto& h : chain) h = mix64(h ^ seed);
}

void prefix_index::match(std::span<const prefix_hash> chain, std::size_t ranks,
                         std::vector<std::uint32_t>& matched) const {
  matched.assign(ranks, 0);
  if (chain.empty()) return;
  // The ranks still matching after each block: those that hold every block so far.
  std::vector<std::uint32_t> alive;
  const auto first = first_holder_.find(chain[0]);
  if (first == first_holder_.end()) return;
  for (std::uint32_t id = first->second; id != none; id = nodes_[id].next_holder) {
    if (nodes_[id].rank < ranks) alive.push_back(nodes_[id].rank);
  }
  for (const auto rank : alive) matched[rank] = 1;
  for (std::size_t i = 1; i < chain.size() && !alive.empty(); ++i) {
    const auto at = first_holder_.find(chain[i]);
    if (at == first_holder_.end()) break;
    std::erase_if(alive, [&](std::uint32_t rank) {
      for (std::uint32_t id = at->second; id != none; id = nodes_[id].next_holder) {
        if (nodes_[id].rank == rank) return false;
      }
      return true;
    });
    for (const auto rank : alive) matched[rank] = static_cast<std::uint32_t>(i + 1);
  }
}

void prefix_index::insert(std::size_t rank, std::span<const prefix_hash> chain) {
  if (capacity_ == 0 || chain.empty()) return;
  if (ranks_.size() <= rank) ranks_.resize(rank + 1);
  // Tail first, so that the head ends up the most recently used; a chain longer than the capacity keeps
  // its head.
  const std::size_t kept = std::min(chain.size(), capacity_);
  for (std::size_t i = kept; i-- > 0;) {
    const prefix_hash hash = chain[i];
    auto [at, fresh_block] = first_holder_.try_emplace(hash, none);
    std::uint32_t id = none;
    for (std::uint32_t h = at->second; h != none; h = nodes_[h].next_holder) {
      if (nodes_[h].rank == rank) {
        id = h;
        break;
      }
    }
    if (id != none) {
      unlink(id);
    } else {
      if (free_nodes_.empty()) {
        id = static_cast<std::uint32_t>(nodes_.size());
        nodes_.emplace_back();
      } else {
        id = free_nodes_.back();
        free_nodes_.pop_back();
      }
      nodes_[id] = node{hash, static_cast<std::uint32_t>(rank), none, none, at->second};
      at->second = id;  // `at` is still valid: nothing was inserted into the map since
      ++ranks_[rank].count;
    }
    push_front(id);
  }
  auto& list = ranks_[rank];
  while (list.count > capacity_) erase(list.tail);
}

void prefix_index::forget(std::size_t rank) {
  if (rank >= ranks_.size()) return;
  while (ranks_[rank].count > 0) erase(ranks_[rank].tail);
}

void prefix_index::unlink(std::uint32_t id) {
  auto& n = nodes_[id];
  auto& list = ranks_[n.rank];
  (n.prev == none ? list.head : nodes_[n.prev].next) = n.next;
  (n.next == none ? list.tail : nodes_[n.next].prev) = n.prev;
  n.prev = n.next = none;
}

void prefix_index::push_front(std::uint32_t id) {
  auto& n = nodes_[id];
  auto& list = ranks_[n.rank];
  n.prev = none;
  n.next = list.head;
  (list.head == none ? list.tail : nodes_[list.head].prev) = id;
  list.head = id;
}

void prefix_index::erase(std::uint32_t id) {
  unlink(id);
  const auto& n = nodes_[id];
  --ranks_[n.rank].count;
  if (const auto at = first_holder_.find(n.hash); at != first_holder_.end()) {
    if (at->second == id) {
      at->second = n.next_holder;
      if (at->second == none) first_holder_.erase(at);
    } else {
      for (std::uint32_t h = at->second; h != none; h = nodes_[h].next_holder) {
        if (nodes_[h].next_holder == id) {
          nodes_[h].next_holder = n.next_holder;
          break;
        }
      }
    }
  }
  free_nodes_.push_back(id);
}

}  // namespace dplb::balancer
