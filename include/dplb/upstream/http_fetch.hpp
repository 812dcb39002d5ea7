#pragma once
// One small request to an engine on a fresh connection, for dplb's own side channels (health checks, engine
// stats, /tokenize), never for proxied requests. Bounded in time and in size.

#include <boost/asio/awaitable.hpp>
#include <chrono>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

#include "dplb/support/io_types.hpp"
#include "dplb/upstream/backend.hpp"

namespace dplb::upstream {

struct fetched {
  unsigned status = 0;
  std::string body;
};

// nullopt when the engine could not be reached, broke the connection, sent a body over `body_limit`, or
// took longer than `timeout` (connect and answer together).
boost::asio::awaitable<std::optional<fetched>> fetch(const backend& target, std::string_view path,
                                                     std::string_view user_agent, std::chrono::milliseconds timeout,
                                                     std::size_t body_limit);

// The same as a POST of a JSON body, from a proxy worker's coroutine (--tokenize engine's /tokenize).
io::task<std::optional<fetched>> post_json(const backend& target, std::string_view path, std::string_view body,
                                           std::string_view user_agent, std::chrono::milliseconds timeout,
                                           std::size_t body_limit);

}  // namespace dplb::upstream
