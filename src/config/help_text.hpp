#pragma once
// --help: every option with its environment variable, config key, range and default.

#include <boost/program_options/options_description.hpp>

namespace dplb::config::detail {

// The options as program_options shows them (and as the command line reader declares them).
boost::program_options::options_description visible_options();

}  // namespace dplb::config::detail
