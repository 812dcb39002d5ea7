// What prefix-aware adds to a request's path, measured apart from the network (bench/prefix_cost.sh runs
// it): reading the body with and without cutting the prompt into its prefix chain, and one pick by
// prefix-aware against one by least-inflight, with the index holding many groups' prefixes. Prints ns per
// operation (the median of several rounds) and the ratios. Not a test: nothing is asserted.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "median_time.hpp"
#include "dplb/balancer/least_inflight.hpp"
#include "dplb/balancer/prefix_aware.hpp"
#include "dplb/server/request_facts.hpp"

using namespace dplb;
using bench::median_per_op;

namespace {

std::string words(std::size_t bytes, unsigned seed) {
  std::string out;
  for (unsigned i = 0; out.size() < bytes; ++i) out += "w" + std::to_string((seed * 7919 + i * 104729) % 100000) + " ";
  out.resize(bytes);
  return out;
}

std::string body_of(const std::string& prompt) {
  return R"({"model": "meta-llama/Llama-3.1-8B", "prompt": ")" + prompt + R"(", "max_tokens": 128, "stream": true})";
}

volatile std::size_t sink = 0;

}  // namespace

int main() {
  std::printf("| what | least-inflight or no chain, ns | prefix-aware or chain, ns | ratio |\n|---|---:|---:|---:|\n");
  for (const std::size_t bytes : {4096u, 32768u}) {
    const auto body = body_of(words(bytes, 1));
    const double plain =
        median_per_op<std::nano>(2000, [&](int) { sink = sink + server::inspect_request_body(body).prompt_tokens; });
    const double chained = median_per_op<std::nano>(
        2000, [&](int) { sink = sink + server::inspect_request_body(body, true).prefix_chain.size(); });
    std::printf("| read a %zu KiB prompt's body | %.0f | %.0f | %.2f |\n", bytes / 1024, plain, chained, chained / plain);
  }
  for (const std::size_t ranks : {4u, 64u}) {
    // 256 groups of 6,000-token prefixes (about 375 blocks) already routed, the index at its default size.
    balancer::prefix_aware prefix({}, nullptr);
    std::vector<balancer::rank_view> views(ranks);
    std::vector<std::vector<std::uint64_t>> chains;
    for (unsigned g = 0; g < 256; ++g) {
      balancer::prefix_chain_builder b;
      b.feed(words(24000, g) + words(400, 1000 + g));
      chains.push_back(b.take());
      balancer::pick_context c;
      c.prefix_chain = chains.back();
      (void)prefix.choose(c, views);
    }
    balancer::least_inflight plain_policy;
    balancer::pick_context none;
    const double plain = median_per_op<std::nano>(20000, [&](int) { sink = sink + *plain_policy.choose(none, views); });
    const double with_prefix = median_per_op<std::nano>(20000, [&](int i) {
      balancer::pick_context c;
      c.prefix_chain = chains[static_cast<std::size_t>(i) % chains.size()];
      sink = sink + *prefix.choose(c, views);
    });
    std::printf("| pick among %zu ranks, a 6,000-token prefix of 256 known | %.0f | %.0f | %.1f |\n", ranks, plain,
                with_prefix, with_prefix / plain);
  }
  return 0;
}
