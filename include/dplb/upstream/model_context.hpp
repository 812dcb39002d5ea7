#pragma once
// How long a context each model has, as the engines' GET /v1/models lists it (vLLM's model cards carry
// `max_model_len`): what a request that sets no max_tokens may at most generate, its prompt aside. A tenant's
// token budget reserves that much for such a request, rather than a guess that a long stream outruns.
//
// Read on first need: the first question wakes a loop
// on the side-channel thread, which reads every backend's /v1/models (each bounded by a timeout and a body
// limit, one after another) and publishes the table whole, logging it when it changed, then reads them again
// every `refresh`. Until the first read has answered, and for a model no engine lists, the answer
// is nullopt (the caller's default applies). Nothing is read from engines while no one asks: a deployment
// without token budgets sends no GET /v1/models.
//
// Threading contract: max_model_len() from any thread, without a lock or I/O (an immutable table behind an
// atomic pointer); start() and stop() from the main thread, start() before any question; the reads run on
// the executor given to start().

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/steady_timer.hpp>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "dplb/upstream/backend.hpp"

namespace dplb::support {
class supervisor;
}

namespace dplb::upstream {

// The models a /v1/models answer lists, each with its max_model_len (models without one are left out).
// Pure, never throws: an answer that is not such a list gives none.
std::vector<std::pair<std::string, std::uint64_t>> model_context_lengths(std::string_view models_answer);

class model_context {
 public:
  // What one read found: per cluster, each model's longest context over that cluster's engines.
  struct table {
    std::vector<std::map<std::string, std::uint64_t, std::less<>>> by_cluster;

    // `model`'s context on `cluster`; a request without a model: the longest of the cluster's.
    std::optional<std::uint64_t> lookup(std::size_t cluster, std::string_view model) const;
  };

  model_context(const topology& topology, std::chrono::milliseconds timeout, std::chrono::milliseconds refresh);

  // Starts the read loop on the executor, supervised (task model_context); it reads nothing until asked.
  void start(const boost::asio::any_io_executor& executor, support::supervisor& supervisor);
  void stop() noexcept;
  // Once the executor's loop has stopped for good: lets go of the timer made on it, which must not outlive its
  // io_context (the application destroys the side-channel thread's loop before this object).
  void loop_stopped() noexcept { wake_.reset(); }

  // Asks for a read (what the first question does): from then on the loop reads every `refresh`.
  void want() const;

  // The longest context of `model` on cluster `cluster`'s engines (a request without a model: the longest of
  // the cluster's), once read; nullopt before, or when no engine of the cluster lists one.
  std::optional<std::uint64_t> max_model_len(std::size_t cluster, std::string_view model) const;

 private:
  boost::asio::awaitable<void> read_loop();
  boost::asio::awaitable<void> read_all();
  void wake() const;

  const topology& topology_;
  std::chrono::milliseconds timeout_;
  std::chrono::milliseconds refresh_;
  std::atomic<std::shared_ptr<const table>> table_;
  mutable std::atomic<bool> wanted_{false};
  std::atomic<bool> stopped_{false};
  std::optional<boost::asio::any_io_executor> executor_;
  mutable std::optional<boost::asio::steady_timer> wake_;  // the loop's wait; cancelled on its executor to wake it
};

}  // namespace dplb::upstream
