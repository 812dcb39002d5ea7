#pragma once
// dplb-bench's command line, shaped like `vllm bench serve`: one struct and the parser that fills it.
// Pure (no sockets), so the flags' contract lives in one place.

#include <cstdint>
#include <iosfwd>
#include <optional>
#include <string>
#include <string_view>

#include "loadgen.hpp"

namespace dplb::bench {

struct cli_options {
  loadgen::run_options run;  // host, port, endpoint (with the base URL's path) and the rest
  std::string backend = "openai";
  std::string base_url;      // as given, or built from --host/--port
  std::string result_json;   // empty: no file
  bool quiet = false;        // no preamble, no progress bar
};

// Either options to run with, or the exit status (0 after --help, 2 after a bad command line).
struct cli_result {
  std::optional<cli_options> options;
  int exit_code = 0;
};

// --help goes to `out`; a bad command line is one line "dplb-bench: ..." on `err`.
cli_result parse_command_line(int argc, const char* const* argv, std::ostream& out, std::ostream& err);

struct base_url_parts {
  std::string host;         // without IPv6 brackets
  std::uint16_t port = 80;
  std::string path_prefix;  // "" or "/prefix" (no trailing slash)
};

// "http://host[:port][/prefix]"; nullopt for anything else (https included: not supported).
std::optional<base_url_parts> parse_base_url(std::string_view url);

}  // namespace dplb::bench
