// Where a failed BOOST_ASSERT goes in builds that keep assertions (no NDEBUG: the fuzzers', a Debug
// build); release builds compile them out. The project defines BOOST_ENABLE_ASSERT_DEBUG_HANDLER for
// one known-wrong assertion of Beast 1.81, which a client could otherwise use to abort such a build:
//
// basic_parser::parse_chunk_header asserts `n >= 5` when it resumes a last chunk ("0" CRLF) whose
// end (the empty line) has not arrived. Five is the shortest whole last chunk, but the parser resumes
// with whatever arrived: "0\r\n" in one read and "\r" in the next present 4 bytes. The code after the
// assertion handles that (it finds no end and asks for more), which is what release builds do. Beast
// fixed the assertion upstream (boostorg/beast pull request 2861, Boost 1.86); with such a Boost the
// exception below no longer applies. Found by fuzz_request_head (tests/fuzz/findings/F7-*).
#include <boost/version.hpp>

#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "dplb/support/boost_assertions.hpp"

namespace {

bool known_wrong_assertion(std::string_view expression, std::string_view function) {
#if BOOST_VERSION < 108600
  return expression == "n >= 5" && function.find("parse_chunk_header") != std::string_view::npos;
#else
  (void)expression;
  (void)function;
  return false;
#endif
}

[[noreturn]] void fail(const char* expression, const char* message, const char* function, const char* file,
                       long line) {
  std::fprintf(stderr, "%s:%ld: %s: Assertion `%s' failed%s%s.\n", file, line, function, expression,
               message != nullptr ? ": " : "", message != nullptr ? message : "");
  std::fflush(stderr);
  std::abort();
}

}  // namespace

namespace boost {

void assertion_failed(const char* expression, const char* function, const char* file, long line) {
  if (known_wrong_assertion(expression, function)) return;
  fail(expression, nullptr, function, file, line);
}

void assertion_failed_msg(const char* expression, const char* message, const char* function, const char* file,
                          long line) {
  if (known_wrong_assertion(expression, function)) return;
  fail(expression, message, function, file, line);
}

}  // namespace boost
