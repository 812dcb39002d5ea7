#pragma once
// A value that the admin port's thread writes and every event-loop thread reads now and then (an
// override, a log): a copy under a mutex, for values too big for an atomic and far off the hot path.

#include <mutex>
#include <utility>

namespace dplb::mock {

template <class T>
class guarded {
 public:
  T load() const {
    std::lock_guard lock(mutex_);
    return value_;
  }
  void store(T value) {
    std::lock_guard lock(mutex_);
    value_ = std::move(value);
  }
  // Changes the value in place: `change(T&)` runs under the lock.
  template <class Change>
  void update(Change change) {
    std::lock_guard lock(mutex_);
    change(value_);
  }

 private:
  mutable std::mutex mutex_;
  T value_{};
};

}  // namespace dplb::mock
