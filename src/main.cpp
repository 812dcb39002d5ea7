// dplb's entry point: parse the configuration, then run. The only code not linked into the tests.

#include <boost/system/system_error.hpp>
#include <iostream>

#include "dplb/app/application.hpp"
#include "dplb/config/settings.hpp"

int main(int argc, char** argv) {
  using namespace dplb;
  config::parse_result parsed;
  try {
    parsed = config::parse_command_line(argc, argv, config::process_environment());
  } catch (const config::config_error& e) {
    std::cerr << "dplb: " << e.what() << "\n";
    return 2;
  }
  if (!parsed.run) {
    std::cout << parsed.print_and_exit;
    return 0;
  }
  try {
    app::configure_logging(*parsed.run);
    // SIGHUP reads the configuration again from the same sources; only its backends are applied.
    const auto reload_backends = [argc, argv] {
      return config::parse_command_line(argc, argv, config::process_environment()).run.value();
    };
    app::application application(std::move(*parsed.run), reload_backends);
    return application.run();
  } catch (const config::config_error& e) {
    std::cerr << "dplb: " << e.what() << "\n";
    return 2;
  } catch (const boost::system::system_error& e) {
    std::cerr << "dplb: cannot listen: " << e.what() << "; is another process using the port?\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "dplb: fatal: " << e.what() << "\n";
    return 1;
  }
}
