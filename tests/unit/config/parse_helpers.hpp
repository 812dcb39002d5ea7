#pragma once
// Shared by the config tests: run dplb's parser on an argument list and an environment as main() would, and
// write the config files it reads.

#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include <stdlib.h>  // mkdtemp

#include <filesystem>
#include <fstream>
#include <string>
#include <system_error>
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

// A fresh directory for config files, removed with everything in it when the test ends.
class temp_dir {
 public:
  temp_dir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "dplb-config-test-XXXXXX").string();
    REQUIRE(::mkdtemp(pattern.data()) != nullptr);
    path_ = pattern;
  }
  ~temp_dir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  temp_dir(const temp_dir&) = delete;
  temp_dir& operator=(const temp_dir&) = delete;

  std::string write(const std::string& name, const std::string& content) const {
    const auto file = path_ / name;
    std::ofstream(file, std::ios::binary) << content;
    return file.string();
  }
  std::string write_json(const std::string& name, const nlohmann::json& content) const {
    return write(name, content.dump(2));
  }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

// The repository root, found from this file's own path. ccache (CCACHE_BASEDIR) makes __FILE__ relative to the
// build directory, which is the parent of the tests/ directory holding this binary.
inline std::filesystem::path source_root() {
  std::filesystem::path here = __FILE__;
  if (here.is_relative()) {
    here = std::filesystem::canonical("/proc/self/exe").parent_path().parent_path() / here;
  }
  return here.lexically_normal().parent_path().parent_path().parent_path().parent_path();
}

// A config file holding `content`, in a directory of its own, and what dplb makes of it with more arguments.
class json_config_file {
 public:
  explicit json_config_file(const nlohmann::json& content) : path_(dir_.write_json("dplb.json", content)) {}
  const std::string& path() const { return path_; }
  settings run(const std::vector<std::string>& more = {}, const environment& env = {}) const {
    return test::run(with_config(more), env);
  }
  std::string error(const std::vector<std::string>& more = {}, const environment& env = {}) const {
    return error_of(with_config(more), env);
  }

 private:
  std::vector<std::string> with_config(const std::vector<std::string>& more) const {
    std::vector<std::string> args{"--config", path_};
    args.insert(args.end(), more.begin(), more.end());
    return args;
  }

  temp_dir dir_;
  std::string path_;
};

}  // namespace dplb::config::test
