#pragma once
// The last batches one KV-events publisher sent, for its replay socket: a subscriber that saw a gap in
// the sequence numbers asks for every batch from some number on (vLLM's ZmqEventPublisher keeps
// `buffer_steps` of them, 10,000 by default). Pure; owned by the publisher thread.

#include <cstddef>
#include <cstdint>
#include <deque>
#include <string>
#include <utility>

namespace dplb::mock {

class kv_replay_buffer {
 public:
  struct entry {
    std::int64_t seq = 0;
    std::string payload;
  };

  explicit kv_replay_buffer(std::size_t capacity) : capacity_(capacity) {}

  // Keeps the batch, forgetting the oldest beyond the capacity (0: keeps nothing).
  void push(std::int64_t seq, std::string payload) {
    if (capacity_ == 0) return;
    if (entries_.size() == capacity_) entries_.pop_front();
    entries_.push_back({seq, std::move(payload)});
  }

  // Calls f(entry) for each kept batch whose seq >= start, in the order they were sent (as vLLM does:
  // after a sequence number was set back by hand, later batches may have lower numbers).
  template <class F>
  void for_each_since(std::int64_t start, F&& f) const {
    for (const auto& e : entries_) {
      if (e.seq >= start) f(e);
    }
  }

  std::size_t size() const { return entries_.size(); }
  std::size_t capacity() const { return capacity_; }

 private:
  std::size_t capacity_;
  std::deque<entry> entries_;
};

}  // namespace dplb::mock
