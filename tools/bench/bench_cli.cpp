#include "bench_cli.hpp"

#include <boost/program_options.hpp>
#include <charconv>
#include <cmath>
#include <ostream>
#include <stdexcept>

namespace dplb::bench {

namespace po = boost::program_options;

std::optional<base_url_parts> parse_base_url(std::string_view url) {
  constexpr std::string_view scheme = "http://";
  if (!url.starts_with(scheme)) return std::nullopt;
  url.remove_prefix(scheme.size());
  const auto slash = url.find('/');
  std::string_view authority = url.substr(0, slash);
  std::string_view path = slash == std::string_view::npos ? std::string_view{} : url.substr(slash);
  while (!path.empty() && path.back() == '/') path.remove_suffix(1);

  base_url_parts parts;
  parts.path_prefix = std::string(path);
  std::string_view port_text;
  if (authority.starts_with('[')) {
    const auto close = authority.find(']');
    if (close == std::string_view::npos) return std::nullopt;
    parts.host = std::string(authority.substr(1, close - 1));
    const auto rest = authority.substr(close + 1);
    if (!rest.empty()) {
      if (rest.front() != ':') return std::nullopt;
      port_text = rest.substr(1);
    }
  } else {
    const auto colon = authority.find(':');
    parts.host = std::string(authority.substr(0, colon));
    if (colon != std::string_view::npos) port_text = authority.substr(colon + 1);
  }
  if (parts.host.empty()) return std::nullopt;
  if (!port_text.empty()) {
    unsigned port = 0;
    const auto [end, ec] = std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
    if (ec != std::errc{} || end != port_text.data() + port_text.size() || port == 0 || port > 65535) {
      return std::nullopt;
    }
    parts.port = static_cast<std::uint16_t>(port);
  }
  return parts;
}

namespace {

struct bad_command_line : std::runtime_error {
  using std::runtime_error::runtime_error;
};

double parse_rate(const std::string& text) {
  if (text == "inf" || text == "Inf" || text == "infinity") return std::numeric_limits<double>::infinity();
  double rate = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), rate);
  if (ec != std::errc{} || end != text.data() + text.size() || !(rate > 0) || std::isinf(rate)) {
    throw bad_command_line("--request-rate must be a number > 0 or 'inf', not '" + text + "'");
  }
  return rate;
}

std::pair<std::string, std::string> parse_header(const std::string& text) {
  // vllm bench serve takes KEY=VALUE; "Key: value" is accepted too.
  const auto split = text.find_first_of("=:");
  if (split == std::string::npos || split == 0) {
    throw bad_command_line("--header must be KEY=VALUE, not '" + text + "'");
  }
  std::string value = text.substr(split + 1);
  if (text[split] == ':' && !value.empty() && value.front() == ' ') value.erase(0, 1);
  return {text.substr(0, split), value};
}

}  // namespace

cli_result parse_command_line(int argc, const char* const* argv, std::ostream& out, std::ostream& err) {
  cli_options cli;
  auto& run = cli.run;
  auto& shape = run.shape;
  std::string endpoint, rate = "inf", dataset = "random", host = "127.0.0.1";
  unsigned port = 8000;
  double timeout_s = 600, burst_spread_ms = 0;
  std::vector<std::string> headers;

  po::options_description visible(
      "dplb-bench: a load generator shaped like `vllm bench serve` (random dataset), reporting how the\n"
      "requests spread over DP ranks (x-dplb-rank). Exit status: 0 all requests succeeded, 1 some failed,\n"
      "2 bad arguments.\n\nOptions");
  // clang-format off
  visible.add_options()
    ("help,h", "this text")
    ("base-url", po::value(&cli.base_url), "server URL, http://HOST[:PORT][/PREFIX] (default: from --host/--port)")
    ("host", po::value(&host)->default_value(host), "server host, when --base-url is not given")
    ("port", po::value(&port)->default_value(port), "server port, when --base-url is not given")
    ("endpoint", po::value(&endpoint), "API path (default /v1/completions; /v1/chat/completions with openai-chat)")
    ("backend", po::value(&cli.backend)->default_value(cli.backend), "openai (completions) or openai-chat (chat)")
    ("model", po::value(&shape.model), "model name (default: the first id of GET /v1/models)")
    ("num-prompts", po::value(&run.num_prompts)->default_value(run.num_prompts), "requests to send")
    ("request-rate", po::value(&rate)->default_value(rate),
     "requests per second, Poisson arrivals shaped by --burstiness; 'inf' sends all at once")
    ("burst-spread-ms", po::value(&burst_spread_ms)->default_value(burst_spread_ms, "0"),
     "with --request-rate inf: request k of N starts at k*MS/N ms, evenly paced over MS ms, as a client that "
     "takes that long to send the burst (0: all at once)")
    ("burstiness", po::value(&run.burstiness)->default_value(run.burstiness, "1.0"),
     "gamma shape of the arrival gaps: 1 Poisson, < 1 burstier, > 1 more even")
    ("max-concurrency", po::value(&run.max_concurrency), "requests in flight at most (default: unlimited)")
    ("dataset-name", po::value(&dataset)->default_value(dataset), "only 'random' (random words)")
    ("random-input-len", po::value(&shape.input_len)->default_value(shape.input_len), "prompt words")
    ("random-output-len", po::value(&shape.output_len)->default_value(shape.output_len), "max tokens asked for")
    ("random-range-ratio", po::value(&shape.range_ratio)->default_value(shape.range_ratio, "0.0"),
     "both lengths vary uniformly by +-ratio, in [0, 1)")
    ("long-share", po::value(&shape.long_share)->default_value(shape.long_share, "0"),
     "a mixed workload: this share of the requests, in [0, 1], drawn at random from the seed, uses the "
     "--long-* lengths instead")
    ("long-input-len", po::value(&shape.long_input_len)->default_value(shape.long_input_len),
     "prompt words of the --long-share requests (0: --random-input-len)")
    ("long-output-len", po::value(&shape.long_output_len)->default_value(shape.long_output_len),
     "max tokens of the --long-share requests (0: --random-output-len)")
    ("prefix-groups", po::value(&shape.prefix_groups)->default_value(shape.prefix_groups),
     "shared prefixes: each request belongs to one of G groups (uniformly, from the seed) and its prompt (a "
     "chat's first user message) starts with the group's fixed --prefix-len words, then its own "
     "--random-input-len words; 0: off")
    ("prefix-len", po::value(&shape.prefix_len)->default_value(shape.prefix_len),
     "words of each group's prefix (with --prefix-groups)")
    ("sessions", po::value(&run.chat_sessions.sessions)->default_value(run.chat_sessions.sessions),
     "multi-turn chat (openai-chat): S conversations of --turns requests; turn k sends every earlier user "
     "message and answer (as received) plus --random-input-len new words, once turn k-1 has completed. The "
     "arrivals and --max-concurrency count sessions; --num-prompts is S*T. 0: off")
    ("turns", po::value(&run.chat_sessions.turns)->default_value(run.chat_sessions.turns), "requests per session")
    ("session-header", po::value(&run.chat_sessions.header),
     "send 'NAME: session-<i>' on every request of session i (for dplb's --affinity-header)")
    ("ignore-eos", po::bool_switch(), "send ignore_eos: true (the engine produces exactly the output length)")
    ("no-stream", po::bool_switch(), "non-streaming requests (TTFT is then the whole response)")
    ("no-keep-alive", po::bool_switch(), "a new connection for every request")
    ("header", po::value(&headers)->composing(), "extra request header KEY=VALUE (repeatable)")
    ("seed", po::value(&run.seed)->default_value(run.seed), "seed for prompts, lengths and arrivals")
    ("result-json", po::value(&cli.result_json), "write the summary and the per-rank counts as JSON here")
    ("threads", po::value(&run.threads)->default_value(run.threads), "client event-loop threads")
    ("timeout-s", po::value(&timeout_s)->default_value(timeout_s, "600"),
     "bound on the whole run, seconds; requests still open then count as failed")
    ("quiet,q", po::bool_switch(&cli.quiet), "no preamble and no progress bar");
  // clang-format on

  po::variables_map vm;
  try {
    po::store(po::command_line_parser(argc, argv).options(visible).run(), vm);
    po::notify(vm);
    if (vm.count("help") != 0) {
      out << visible << '\n';
      return {std::nullopt, 0};
    }
    if (cli.backend == "openai" || cli.backend == "vllm") {
      shape.endpoint = endpoint.empty() ? "/v1/completions" : endpoint;
    } else if (cli.backend == "openai-chat" || cli.backend == "vllm-chat") {
      shape.endpoint = endpoint.empty() ? "/v1/chat/completions" : endpoint;
    } else {
      throw bad_command_line("--backend must be openai or openai-chat, not '" + cli.backend + "'");
    }
    if (run.chat_sessions.enabled()) {
      const std::size_t requests = run.chat_sessions.sessions * run.chat_sessions.turns;
      if (vm["num-prompts"].defaulted()) {
        run.num_prompts = requests;
      } else if (run.num_prompts != requests) {
        throw bad_command_line("--num-prompts must be --sessions * --turns (" + std::to_string(requests) +
                               ") or left out");
      }
    }
    if (dataset != "random") throw bad_command_line("--dataset-name: only 'random' is supported");
    if (cli.base_url.empty()) {
      if (port == 0 || port > 65535) throw bad_command_line("--port must be 1..65535");
      const bool ipv6 = host.find(':') != std::string::npos;
      cli.base_url = "http://" + (ipv6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
    }
    const auto url = parse_base_url(cli.base_url);
    if (!url) throw bad_command_line("--base-url must look like http://HOST[:PORT][/PREFIX], not '" + cli.base_url + "'");
    run.host = url->host;
    run.port = url->port;
    if (!shape.endpoint.starts_with('/')) throw bad_command_line("--endpoint must start with '/'");
    shape.endpoint = url->path_prefix + shape.endpoint;
    run.request_rate = parse_rate(rate);
    run.burst_spread = std::chrono::duration<double>(burst_spread_ms / 1000);  // checked by validate()
    if (vm.count("max-concurrency") != 0 && run.max_concurrency == 0) {
      throw bad_command_line("--max-concurrency must be >= 1");
    }
    if (!(timeout_s > 0) || timeout_s > 1e7) throw bad_command_line("--timeout-s must be > 0");
    run.timeout = std::chrono::milliseconds(static_cast<std::int64_t>(std::ceil(timeout_s * 1000)));
    shape.ignore_eos = vm["ignore-eos"].as<bool>();
    shape.stream = !vm["no-stream"].as<bool>();
    run.keep_alive = !vm["no-keep-alive"].as<bool>();
    for (const auto& header : headers) shape.extra_headers.push_back(parse_header(header));
    if (const auto problem = loadgen::validate(run); !problem.empty()) throw bad_command_line(problem);
  } catch (const po::error& e) {
    err << "dplb-bench: " << e.what() << " (see --help)\n";
    return {std::nullopt, 2};
  } catch (const bad_command_line& e) {
    err << "dplb-bench: " << e.what() << '\n';
    return {std::nullopt, 2};
  }
  return {std::move(cli), 0};
}

}  // namespace dplb::bench
