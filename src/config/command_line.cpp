#include <boost/program_options.hpp>

#include "help_text.hpp"
#include "sources.hpp"
#include "value_parsers.hpp"

namespace dplb::config::detail {
namespace {

namespace po = boost::program_options;

// Stray words on the command line are collected under this hidden name so that the error can quote them.
constexpr const char* positional_name = "dplb-positional-argument";

std::string unknown_option_message(std::string_view given) {
  if (const auto eq = given.find('='); eq != std::string_view::npos) given = given.substr(0, eq);
  std::string msg = "unknown option '" + std::string(given) + "'";
  std::string_view bare = given;
  while (bare.starts_with('-')) bare.remove_prefix(1);
  std::vector<std::string_view> flags;
  for (const auto& o : options()) flags.push_back(o.flag);
  if (auto near = closest(bare, flags)) msg += " (did you mean '--" + *near + "'?)";
  return msg + "; see 'dplb --help'";
}

}  // namespace

command_line_values read_command_line(int argc, const char* const* argv) {
  po::options_description all = visible_options();
  all.add_options()(positional_name, po::value<std::string>());
  po::positional_options_description positional;
  positional.add(positional_name, -1);
  // No short options (there are none, and "-listen" must not read as "-l isten") and no guessing of
  // abbreviations: a script that works today must not change meaning when an option is added.
  const int style = po::command_line_style::allow_long | po::command_line_style::long_allow_adjacent |
                    po::command_line_style::long_allow_next;

  std::vector<std::string> args;
  for (int i = 1; i < argc; ++i) args.emplace_back(argv[i]);

  po::parsed_options parsed(nullptr);
  try {
    parsed = po::command_line_parser(args).options(all).positional(positional).style(style).run();
  } catch (const po::unknown_option& e) {
    throw config_error(unknown_option_message(e.get_option_name()));
  } catch (const po::invalid_command_line_syntax& e) {
    if (e.kind() == po::invalid_syntax::missing_parameter) {
      throw config_error("option '" + e.get_option_name() + "' needs a value; see 'dplb --help'");
    }
    if (e.kind() == po::invalid_syntax::empty_adjacent_parameter) {
      throw config_error("option '" + e.get_option_name() + "' needs a value after '='; see 'dplb --help'");
    }
    if (e.kind() == po::invalid_syntax::extra_parameter) {
      throw config_error("option '" + e.get_option_name() + "' takes no value; see 'dplb --help'");
    }
    throw config_error(std::string("invalid command line: ") + e.what() + "; see 'dplb --help'");
  } catch (const po::error& e) {
    throw config_error(std::string("invalid command line: ") + e.what() + "; see 'dplb --help'");
  }

  command_line_values values;
  for (const po::option& opt : parsed.options) {
    const std::string value = opt.value.empty() ? std::string() : opt.value.front();
    if (opt.string_key == positional_name) {
      if (opt.position_key < 0) throw config_error(unknown_option_message("--" + opt.string_key));
      if (value.starts_with('-')) throw config_error(unknown_option_message(value));
      throw config_error("unexpected argument '" + value + "'; options start with '--', see 'dplb --help'");
    }
    // program_options takes the next word as the value even when it is another option, which would turn
    // "--listen --backend URL" into a baffling complaint about URL.
    if (value.starts_with("--") && find_option(opt.string_key).kind != value_kind::flag) {
      throw config_error("option '--" + opt.string_key + "' needs a value; see 'dplb --help'");
    }
    auto& slot = values[opt.string_key];
    if (!slot.empty() && find_option(opt.string_key).kind != value_kind::url_list) {
      // Last-one-wins would hide a mistake in a long command line; only --backend repeats.
      throw config_error("option '--" + opt.string_key + "' given more than once ('" + slot.front() + "' and '" +
                         value + "'); pass it once");
    }
    slot.push_back(value);
  }
  return values;
}

}  // namespace dplb::config::detail
