#pragma once
// One client connection, served by one coroutine from accept to close: read a request, answer dplb's
// own paths (/metrics, /health) or pick a rank and relay the request and its response, repeat while the
// connection is kept alive. Every wait has a deadline (settings.hpp); every error on the request path is
// a value, answered with an OpenAI-style JSON error when no response byte has gone out yet, or by
// closing the connection when one has (the client then sees a truncated response).


#include "dplb/server/proxy_context.hpp"
#include "dplb/support/io_types.hpp"

namespace dplb::server {

io::task<void> run_session(worker_state& worker, io::socket socket);

}  // namespace dplb::server
