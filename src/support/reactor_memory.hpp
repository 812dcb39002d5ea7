#pragma once
// Included by asio_beast_impl.cpp only, before Asio's implementation, which it changes: the epoll
// reactor's per-socket states come from dense slabs (include/dplb/support/reactor_memory.hpp says why).
// Asio allocates them through object_pool_access::create and frees them through destroy, both member
// templates meant for this kind of customisation; the specialisations below must be seen before the
// reactor's implementation uses them, which is why this file is included first. Asio's object pool
// only ever calls destroy when its reactor is destroyed, and the slots go back to a free list here.

#include <boost/asio/detail/config.hpp>

#include <cstddef>

#if defined(BOOST_ASIO_HAS_EPOLL) && !defined(BOOST_ASIO_HAS_IO_URING_AS_DEFAULT)

#include <boost/asio/detail/epoll_reactor.hpp>
#include <boost/asio/detail/object_pool.hpp>

#include <cstring>
#include <mutex>
#include <new>

namespace dplb::io::detail {

// Fixed-size slots carved from slabs that are never freed (Asio never frees what they hold either).
// Every reactor of the process takes from it, each under its own lock only: hence a lock here. A slot
// is taken only when Asio's own free list is empty, that is when more sockets are open than ever
// before, so the lock is never on a steady path.
template <std::size_t SlotSize, std::size_t SlotAlign>
class slab_slots {
 public:
  static constexpr std::size_t slots_per_slab = 256;
  static constexpr std::size_t slot_size = (SlotSize + SlotAlign - 1) / SlotAlign * SlotAlign;

  void* take() {
    std::lock_guard lock(mutex_);
    if (free_ != nullptr) {
      void* slot = free_;
      std::memcpy(&free_, slot, sizeof(void*));
      return slot;
    }
    if (left_ == 0) {
      next_ = static_cast<char*>(::operator new(slot_size * slots_per_slab, std::align_val_t{SlotAlign}));
      left_ = slots_per_slab;
    }
    void* slot = next_;
    next_ += slot_size;
    --left_;
    ++made_;
    return slot;
  }
  void give(void* slot) noexcept {
    std::lock_guard lock(mutex_);
    std::memcpy(slot, &free_, sizeof(void*));
    free_ = slot;
  }
  std::size_t made() noexcept {
    std::lock_guard lock(mutex_);
    return made_;
  }

 private:
  std::mutex mutex_;
  void* free_ = nullptr;    // slots given back, linked through their first bytes
  char* next_ = nullptr;    // the next slot never taken in the newest slab
  std::size_t left_ = 0;    // slots never taken in the newest slab
  std::size_t made_ = 0;
};

using reactor_state = boost::asio::detail::epoll_reactor::descriptor_state;
static_assert(sizeof(reactor_state) >= sizeof(void*));

inline slab_slots<sizeof(reactor_state), alignof(reactor_state)>& reactor_state_slots() {
  // Never destroyed: a reactor torn down during static destruction still gives its states back here.
  static auto* slots = new slab_slots<sizeof(reactor_state), alignof(reactor_state)>;
  return *slots;
}

}  // namespace dplb::io::detail

namespace boost::asio::detail {

// The reactor's allocate_descriptor_state(): object_pool<descriptor_state>::alloc(bool locking).
template <>
inline epoll_reactor::descriptor_state* object_pool_access::create<epoll_reactor::descriptor_state, bool>(
    bool locking) {
  auto& slots = dplb::io::detail::reactor_state_slots();
  void* slot = slots.take();
  try {
    return ::new (slot) epoll_reactor::descriptor_state(locking);
  } catch (...) {
    slots.give(slot);
    throw;
  }
}

template <>
inline void object_pool_access::destroy<epoll_reactor::descriptor_state>(epoll_reactor::descriptor_state* state) {
  state->~descriptor_state();
  dplb::io::detail::reactor_state_slots().give(state);
}

}  // namespace boost::asio::detail

// Declared in include/dplb/support/reactor_memory.hpp (not on this target's include path).
namespace dplb::io {
std::size_t reactor_states_made() noexcept { return detail::reactor_state_slots().made(); }
}  // namespace dplb::io

#else

namespace dplb::io {
std::size_t reactor_states_made() noexcept { return 0; }  // another reactor: Asio's own allocation
}  // namespace dplb::io

#endif
