#pragma once
// Shared by the config tests: run dplb's parser on an argument list and an environment as main() would.

#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "dplb/config/settings.hpp"

namespace dplb::config::test {

inline parse_result parse(const std::vector<std::string>& args, const environment& env = {}) {
  std::vector<const char*> argv{"dplb"};
  for (const auto& a : args) argv.push_back(a.c_str());
  return parse_command_line(static_cast<int>(argv.size()), argv.data(), env);
}

// The settings to run with; fails the test when parsing asks to print and exit instead.
inline settings run(const std::vector<std::string>& args, const environment& env = {}) {
  auto result = parse(args, env);
  REQUIRE(result.run.has_value());
  CHECK(result.print_and_exit.empty());
  return *result.run;
}

// The backends' URLs, in rank order (the tests of options other than #dp and #weight look at these).
inline std::vector<std::string> urls_of(const std::vector<backend_spec>& backends) {
  std::vector<std::string> urls;
  for (const auto& b : backends) urls.push_back(b.url);
  return urls;
}

// The message of the config_error that parsing throws; fails the test when nothing (or something else)
// is thrown.
inline std::string error_of(const std::vector<std::string>& args, const environment& env = {}) {
  try {
    parse(args, env);
  } catch (const config_error& e) {
    const std::string what = e.what();
    CHECK(what.find('\n') == std::string::npos);  // one line, always
    return what;
  }
  FAIL("expected a config_error");
  return {};
}

}  // namespace dplb::config::test
