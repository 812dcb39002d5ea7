#include "processes.hpp"

#include "http_client.hpp"

#include <algorithm>
#include <map>
#include <regex>
#include <stdexcept>

namespace dplb::test {

const char* dplb_binary() { return DPLB_TEST_DPLB_BINARY; }
const char* mock_engine_binary() { return DPLB_TEST_MOCK_ENGINE_BINARY; }

namespace {
std::vector<std::string> concat(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}
}  // namespace

mock_engine::mock_engine(std::size_t ranks, std::vector<std::string> extra_args)
    : process_(mock_engine_binary(),
               concat({"--host", "127.0.0.1", "--port", "0", "--ranks", std::to_string(ranks)}, extra_args)) {
  const std::regex listening(R"(mock-engine rank (\d+) listening on [^:]+:(\d+))");
  ports_.resize(ranks);
  for (std::size_t i = 0; i < ranks; ++i) {
    auto m = process_.wait_for_line(listening, std::chrono::seconds(10));
    if (!m) throw std::runtime_error("mock engine did not start:\n" + process_.output());
    ports_.at(std::stoul((*m)[1])) = static_cast<std::uint16_t>(std::stoul((*m)[2]));
  }
  auto admin = process_.wait_for_line(std::regex(R"(mock-engine admin listening on [^:]+:(\d+))"), std::chrono::seconds(10));
  if (!admin) throw std::runtime_error("mock engine printed no admin port:\n" + process_.output());
  admin_port_ = static_cast<std::uint16_t>(std::stoul((*admin)[1]));
  if (!process_.wait_for_line(std::regex("mock-engine ready"), std::chrono::seconds(10))) {
    throw std::runtime_error("mock engine not ready:\n" + process_.output());
  }
}

std::vector<std::string> mock_engine::urls() const {
  std::vector<std::string> out;
  for (auto p : ports_) out.push_back("http://127.0.0.1:" + std::to_string(p));
  return out;
}

void mock_engine::set_fault(std::size_t rank, const std::string& json) {
  auto r = http_post_json(admin_port_, "/fault?rank=" + std::to_string(rank), json);
  if (r.status != 200) throw std::runtime_error("mock refused fault " + json + ": " + r.body + r.error);
}

void mock_engine::clear_fault(std::size_t rank) {
  http_connection c(admin_port_);
  auto r = c.send({bhttp::verb::delete_, "/fault?rank=" + std::to_string(rank), 11});
  if (r.status != 200) throw std::runtime_error("mock refused to clear rank " + std::to_string(rank) + ": " + r.body);
}

std::map<std::string, double> mock_engine::metrics(std::size_t rank) const {
  auto r = http_get(admin_port_, "/metrics?rank=" + std::to_string(rank));
  if (r.status != 200) throw std::runtime_error("mock admin /metrics failed: " + r.body + r.error);
  return parse_metrics(r.body);
}

void mock_engine::override_metrics(std::size_t rank, std::size_t engine, const std::string& json) {
  auto r = http_post_json(admin_port_, "/metrics/override?rank=" + std::to_string(rank) + "&engine=" + std::to_string(engine), json);
  if (r.status != 200) throw std::runtime_error("mock refused override " + json + ": " + r.body + r.error);
}

void mock_engine::clear_metric_overrides() {
  http_connection c(admin_port_);
  auto r = c.send({bhttp::verb::delete_, "/metrics/override", 11});
  if (r.status != 200) throw std::runtime_error("mock refused to clear overrides: " + r.body);
}

void mock_engine::serve_raw_metrics(std::size_t rank, const std::string& text) {
  http_connection c(admin_port_);
  bhttp::request<bhttp::string_body> request{bhttp::verb::post, "/metrics/raw?rank=" + std::to_string(rank), 11};
  request.set(bhttp::field::content_type, "text/plain");
  request.body() = text;
  auto r = c.send(request);
  if (r.status != 200) throw std::runtime_error("mock refused raw metrics: " + r.body);
}

std::string mock_engine::stats() const {
  auto r = http_get(admin_port_, "/stats");
  if (r.status != 200) throw std::runtime_error("mock admin /stats failed: " + r.body + r.error);
  return r.body;
}

dplb_proxy::dplb_proxy(const std::vector<std::string>& backends, std::vector<std::string> extra_args)
    : process_(dplb_binary(), [&] {
        std::vector<std::string> args{"--listen", "127.0.0.1:0"};
        for (const auto& b : backends) {
          args.push_back("--backend");
          args.push_back(b);
        }
        return concat(args, extra_args);
      }()) {
  auto m = process_.wait_for_line(std::regex(R"(listening on 127\.0\.0\.1:(\d+))"), std::chrono::seconds(10));
  if (!m) throw std::runtime_error("dplb did not start:\n" + process_.output());
  port_ = static_cast<std::uint16_t>(std::stoul((*m)[1]));
  if (std::find(extra_args.begin(), extra_args.end(), "--admin-listen") == extra_args.end()) return;
  // Printed after the public listener's line, once the admin acceptor is bound.
  auto admin = process_.wait_for_line(std::regex(R"(admin API listening on [^ ]+:(\d+))"), std::chrono::seconds(10));
  if (!admin) throw std::runtime_error("dplb printed no admin API port:\n" + process_.output());
  admin_port_ = static_cast<std::uint16_t>(std::stoul((*admin)[1]));
}

double metric_sum(const std::map<std::string, double>& metrics, const std::string& prefix,
                  const std::vector<std::string>& fragments) {
  double sum = 0;
  for (const auto& [key, value] : metrics) {
    if (key.rfind(prefix, 0) != 0) continue;
    bool all = true;
    for (const auto& f : fragments) all = all && key.find(f) != std::string::npos;
    if (all) sum += value;
  }
  return sum;
}

}  // namespace dplb::test
