#pragma once
// A file under /tmp that a test writes (a config file, a token file) and that is removed when the test
// ends, however it ends.

#include <stdlib.h>  // mkstemp
#include <unistd.h>

#include <fstream>
#include <stdexcept>
#include <string>

namespace dplb::test {

class temp_file {
 public:
  explicit temp_file(const std::string& content = {}) {
    char pattern[] = "/tmp/dplb-test-XXXXXX";
    const int fd = ::mkstemp(pattern);
    if (fd < 0) throw std::runtime_error("mkstemp failed");
    ::close(fd);
    path_ = pattern;
    write(content);
  }
  ~temp_file() { ::unlink(path_.c_str()); }
  temp_file(const temp_file&) = delete;
  temp_file& operator=(const temp_file&) = delete;

  // Replaces the content.
  void write(const std::string& content) const { std::ofstream(path_, std::ios::trunc) << content; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace dplb::test
