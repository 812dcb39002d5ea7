#pragma once
// Private to the session: waiting for an answer of the ledger dplb replicas share (--shared-state) without
// blocking the session's thread. The ledger answers on its own thread, through a callback; the answer is
// handed to the session's thread. The ledger answers everything within --shared-state-timeout-ms (with or
// without what was asked); should its thread be gone, the session stops waiting a little later all the same,
// and an answer that lands after that is dropped where it lands, undone by the caller's `dropped`.

#include <boost/asio/post.hpp>

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <utility>

#include "dplb/config/settings.hpp"
#include "dplb/support/io_types.hpp"

namespace dplb::server {

// `ask(reply)` starts the ledger's call; `reply(Answer)` is called once, on any thread. Nullopt when no
// answer came within `give_up_after`. An answer that comes after that, or once the session is gone, goes to
// `dropped` where it lands (a bucket's units taken for nobody go back; a lease releases itself).
template <class Answer, class Ask, class Dropped>
io::task<std::optional<Answer>> await_ledger(const io::executor& executor, std::chrono::steady_clock::duration give_up_after,
                                             Ask ask, Dropped dropped) {
  struct answer_state {
    explicit answer_state(const io::executor& ex) : timer(ex) {}
    io::steady_timer timer;
    std::optional<Answer> answer;
    bool gave_up = false;
  };
  auto state = std::make_shared<answer_state>(executor);
  state->timer.expires_after(give_up_after);
  // The ledger holds the state weakly: at shutdown its pending callbacks outlive the workers, and the last
  // owner of the state (and of its timer, of a worker's loop) must be the session.
  std::function<void(Answer)> reply = [weak = std::weak_ptr(state), executor, dropped](Answer answer) {
    if (weak.expired()) {  // the session is gone
      dropped(std::move(answer));
      return;
    }
    boost::asio::post(executor, [weak, dropped, answer = std::move(answer)]() mutable {
      const auto state = weak.lock();
      if (!state || state->gave_up) {  // too late
        dropped(std::move(answer));
        return;
      }
      state->answer = std::move(answer);
      state->timer.cancel();
    });
  };
  ask(std::move(reply));
  if (!state->answer) co_await state->timer.async_wait(io::as_result);
  if (!state->answer) state->gave_up = true;
  co_return std::move(state->answer);
}

template <class Answer, class Ask>
io::task<std::optional<Answer>> await_ledger(const io::executor& executor, std::chrono::steady_clock::duration give_up_after,
                                             Ask ask) {
  return await_ledger<Answer>(executor, give_up_after, std::move(ask), [](Answer&&) {});
}

// How long a session waits for the ledger: twice its timeout and a margin, since the ledger's own deadline
// answers first unless its thread is gone.
inline std::chrono::steady_clock::duration ledger_patience(const config::settings& settings) {
  return 2 * settings.shared_state_timeout + std::chrono::milliseconds(50);
}

}  // namespace dplb::server
