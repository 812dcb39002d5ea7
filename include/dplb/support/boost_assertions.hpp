#pragma once

// The handlers of failed Boost assertions, defined in src/support/boost_assert_handler.cpp (why there).
// <boost/assert.hpp> declares them only in builds that keep assertions; this declares them in every
// build, so that their definition and its test compile with NDEBUG too.
namespace boost {

void assertion_failed(char const* expr, char const* function, char const* file, long line);
void assertion_failed_msg(char const* expr, char const* msg, char const* function, char const* file, long line);

}  // namespace boost
