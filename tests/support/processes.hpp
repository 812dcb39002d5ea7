#pragma once
// The real programs an integration test runs: the mock engine (K ranks on ephemeral ports) and dplb in
// front of it. Each waits for its own "listening" lines rather than sleeping, and stops its own pid.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "child_process.hpp"

namespace dplb::test {

// Paths of the binaries under test, set by CMake.
const char* dplb_binary();
const char* mock_engine_binary();

class mock_engine {
 public:
  explicit mock_engine(std::size_t ranks, std::vector<std::string> extra_args = {});
  const std::vector<std::uint16_t>& ports() const { return ports_; }
  std::vector<std::string> urls() const;
  child_process& process() { return process_; }

  // The admin port: faults per rank (see tools/mock_engine/README.md), reachable whatever the faults.
  std::uint16_t admin_port() const { return admin_port_; }
  // POST /fault?rank=i with the JSON object; throws if the mock refuses it.
  void set_fault(std::size_t rank, const std::string& json);
  void clear_fault(std::size_t rank);
  // The rank's /metrics, read through the admin port (works while the rank's own port is closed).
  std::map<std::string, double> metrics(std::size_t rank) const;
  // What the rank's engine `engine` (0 without --dp) reports on /metrics: any of running, waiting,
  // kv_cache_usage, e.g. R"({"running":40})"; kept until clear_metric_overrides().
  void override_metrics(std::size_t rank, std::size_t engine, const std::string& json);
  void clear_metric_overrides();
  // The rank's /metrics answers exactly `text` (garbage, NaN, missing series) until restore_metrics().
  void serve_raw_metrics(std::size_t rank, const std::string& text);
  // GET /stats of the admin port (per port and engine: requests routed, by header, in flight).
  std::string stats() const;

 private:
  child_process process_;
  std::vector<std::uint16_t> ports_;
  std::uint16_t admin_port_ = 0;
};

class dplb_proxy {
 public:
  // backends: URLs in rank order; extra_args e.g. {"--policy", "round-robin", "--threads", "2"}. With
  // "--admin-listen" among them, it also waits for the admin API's line (see admin_port()).
  dplb_proxy(const std::vector<std::string>& backends, std::vector<std::string> extra_args = {});
  std::uint16_t port() const { return port_; }
  // The admin API's port (--admin-listen 127.0.0.1:0 picks one); 0 when dplb serves no admin API.
  std::uint16_t admin_port() const { return admin_port_; }
  child_process& process() { return process_; }

 private:
  child_process process_;
  std::uint16_t port_ = 0;
  std::uint16_t admin_port_ = 0;
};

// Sum of a metric over the series whose key contains every given fragment, e.g.
// metric_sum(m, "dplb_requests_total{", {"rank=\"0\""}).
double metric_sum(const std::map<std::string, double>& metrics, const std::string& prefix,
                  const std::vector<std::string>& fragments = {});

}  // namespace dplb::test
