#include "help_text.hpp"

#include <boost/program_options.hpp>

#include <sstream>
#include <string>

#include "dplb/support/policy_names.hpp"
#include "dplb/config/settings.hpp"
#include "option_table.hpp"
#include "value_parsers.hpp"

#ifndef DPLB_VERSION
#error "DPLB_VERSION must be defined by the build (see CMakeLists.txt)"
#endif

namespace dplb::config {
namespace detail {

namespace po = boost::program_options;

// Options are shown in --help with their other two spellings and their default, so that --help alone is
// enough to write an environment or a config file.
po::options_description visible_options() {
  const settings defaults;
  po::options_description desc("Options", 100, 60);
  for (const auto& o : options()) {
    std::string text(o.meaning);
    if (o.kind == value_kind::number) {
      text += " Range " + std::to_string(o.min) + ".." + std::to_string(o.max) + " " + std::string(o.unit) +
              (o.why_max.empty() ? "" : ": " + std::string(o.why_max)) + ".";
    }
    // Separate short lines, so that wrapping never splits "default" from its value.
    if (!o.env.empty()) text += "\nenv " + std::string(o.env);
    if (!o.key.empty()) text += "\nconfig key \"" + std::string(o.key) + "\"";
    if (o.show_default) text += "\ndefault " + o.show_default(defaults);
    const std::string name(o.flag);
    // A boolean is a flag on the command line: given alone, it is on.
    if (o.kind == value_kind::flag || o.kind == value_kind::boolean) {
      desc.add_options()(name.c_str(), text.c_str());
    } else {
      desc.add_options()(name.c_str(), po::value<std::string>()->value_name(value_name_of(o)), text.c_str());
    }
  }
  return desc;
}

}  // namespace detail

using support::policy_names;
using detail::join;
using detail::visible_options;

std::string help_text() {
  std::ostringstream out;
  out << "Usage: dplb --listen HOST:PORT --backend URL [--backend URL ...] --policy "
      << join(policy_names, "|", "|") << "\n"
      << "            [--threads N] [--config FILE] [--log-level LEVEL] [more options below]\n\n"
      << "dplb " << DPLB_VERSION
      << ": an HTTP/1.1 load balancer in front of vLLM engine servers, one per data-parallel rank.\n\n"
      << "Every option can also be set by its environment variable or by its key in the JSON config file.\n"
      << "Precedence, per option: command line > environment > config file > default. The backend list is\n"
      << "taken whole from the highest-precedence source that has one (sources are never merged), the config\n"
      << "file's \"clusters\" included.\n"
      << "The admin API's token is the one setting without a flag or key: DPLB_ADMIN_TOKEN (environment only),\n"
      << "unless --admin-token-file names a file that holds it.\n"
      << "Signals: SIGTERM or SIGINT drains and exits (--drain-timeout-ms); SIGHUP reads the configuration\n"
      << "again and applies its backends (added, removed, reweighted), its tenants (queued requests are kept)\n"
      << "and the admin token's file without a restart; nothing else reloads.\n\n"
      << visible_options();
  // program_options pads wrapped lines with spaces; trailing blanks are noise in a terminal or a diff.
  std::string text = out.str();
  std::string tidy;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    line.erase(line.find_last_not_of(' ') + 1);
    tidy += line + "\n";
  }
  return tidy;
}

}  // namespace dplb::config
