#include "echo_report.hpp"

#include <nlohmann/json.hpp>

namespace dplb::mock {

std::string render_echo_report(const received_request& request) {
  using ordered_json = nlohmann::ordered_json;
  ordered_json headers = ordered_json::array();
  for (const auto& [name, value] : request.headers) {
    headers.push_back(ordered_json::array({std::string(name), std::string(value)}));
  }

  static constexpr char hex_digits[] = "0123456789abcdef";
  std::string fingerprint(16, '0');
  auto hash = fnv1a64(request.body);
  for (auto digit = fingerprint.rbegin(); digit != fingerprint.rend(); ++digit, hash >>= 4) {
    *digit = hex_digits[hash & 0xF];
  }

  ordered_json report;
  report["method"] = request.method;
  report["target"] = request.target;
  report["headers"] = std::move(headers);
  report["body_size"] = request.body.size();
  report["body_fnv1a64"] = std::move(fingerprint);
  report["chunked"] = request.chunked;
  report["engine"] = request.engine;
  report["x_data_parallel_rank"] =
      request.dp_rank_header ? ordered_json(std::string(*request.dp_rank_header)) : ordered_json(nullptr);
  // Header bytes are whatever the client sent; replace invalid UTF-8 rather than fail.
  return report.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace dplb::mock
