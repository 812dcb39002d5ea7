#pragma once
// Private to the session: the first leg of a disaggregated request. A prefill rank of the cluster's prefill
// pool is picked (after a wait in that pool's queue under --max-inflight-per-rank), sent the prefill body,
// and its answer read whole: its kv_transfer_params say where the prompt's KV cache waits for the decode
// leg. A rank that refuses or resets before answering is replaced by another of the pool, as any request's
// rank is (--max-retries; under --max-inflight-per-rank, after a wait first in the pool's queue when every
// untried prefill rank is full). Any other answer than a 200 with kv_transfer_params is the client's to see: the
// session relays it as it came, and no decode leg runs.

#include <boost/beast/http/error.hpp>

#include <algorithm>
#include <chrono>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "dplb/pd/leg_bodies.hpp"
#include "buffered_parse.hpp"
#include "request_accounting.hpp"
#include "slot_wait.hpp"
#include "upstream_exchange.hpp"

namespace dplb::server {

// A prefill answer is one token and the kv_transfer_params (a block id per 16 tokens of prompt: about
// 50 KiB for a 128k-token prompt). Anything near this bound is no prefill answer.
inline constexpr std::size_t max_prefill_answer_bytes = 8u << 20;

class prefill_leg {
 public:
  enum class result {
    params_ready,    // a 200 with kv_transfer_params: params() is the decode leg's
    relay_answer,    // the engine's answer (its head read, its body not) goes to the client as it came
    failed,          // no usable answer from any prefill rank: failure() says why (see the session)
    client_gone,     // the client left: the engine connection is closed, no further leg may run
  };

  // `request`: the decode leg's pick, whose cluster's prefill pool serves this leg; `cost`: its cost, of which
  // the prefill leg has the prompt and one token. `watch`: the session's, for the exchange (armed later).
  prefill_leg(worker_state& worker, client_watch& watch, http::response_head& response_head, socket_deadline& deadline,
              const balancer::pick_context& request, balancer::request_cost cost)
      : shared_(worker.shared), watch_(watch), exchange_(worker, watch, response_head, deadline), deadline_(deadline),
        request_(request), cost_{cost.prompt, 1} {
    request_.cluster = *shared_.settings.clusters.at(request.cluster).prefill_pool;
    request_.pinned_rank.reset();  // a pinned rank is the decode leg's
    request_.avoid = nullptr;
    request_.prefilled_elsewhere = false;  // this leg is where the prompt is prefilled
    request_.decode_tokens = 1;
  }

  // A prefill rank, at once or after a wait in the prefill ranks' queue (--max-inflight-per-rank). Called
  // before the session arms its client watch: the queue's wait watches the client itself. `access`: the
  // request's access log entry, which this leg's accounting fills until the decode leg takes it over.
  // `ticket`: the request's place in the queue (its priority and tenant's share, its longest wait).
  io::task<slot_refusal> acquire(io::tcp_stream& client, metrics::access_entry* access, const queue_ticket& ticket) {
    client_ = &client;
    ticket_ = ticket;
    auto slot = slot_without_queue(shared_, request_, cost_);
    if (!slot) slot = co_await wait_for_slot(client, shared_, request_, cost_, ticket);
    if (!slot->lease) co_return slot->refusal;
    accounting_.emplace(shared_, std::move(slot->lease), access);
    co_return slot_refusal::none;
  }

  // What the client is told when the prefill rank answered 200 without kv_transfer_params.
  std::string missing_params_text() const {
    const auto rank = accounting_->rank();
    return "prefill rank " + std::to_string(rank) + " (" + shared_.topology.ranks()[rank].name +
           ") answered without kv_transfer_params: start the prefill engines with --kv-transfer-config (e.g. "
           "NixlConnector)";
  }

  // What the client is told when acquire() found no prefill rank.
  std::string refusal_text(slot_refusal refusal) const {
    return "no prefill rank for the request: " + refusal_message(refusal, request_, false);
  }

  // Sends the prefill body (`head` framed for it) to the acquired rank, and to another on a refusal.
  io::task<result> run(const upstream_head& head, std::string_view body) {
    std::vector<bool> tried;
    const auto sent_at = std::chrono::steady_clock::now();
    for (std::size_t retries = 0;; ++retries) {
      const auto attempt = co_await exchange_.send(accounting_->rank(), head, body, false);
      if (!attempt.ec) break;
      if (watch_.client_gone) {
        accounting_->finish(499);
        co_return result::client_gone;
      }
      accounting_->attempt_failed(attempt.kind, attempt.health);
      if (attempt.retry_elsewhere && retries < shared_.settings.max_retries) {
        if (accounting_->move_elsewhere(request_, cost_, tried)) continue;
        const bool moved = co_await accounting_->wait_elsewhere(*client_, request_, cost_, ticket_, watch_);
        if (moved) continue;
        if (watch_.client_gone) {
          accounting_->finish(499);
          co_return result::client_gone;
        }
      }
      failure_ = attempt;
      co_return result::failed;
    }
    took_ = std::chrono::steady_clock::now() - sent_at;
    const unsigned status = exchange_.response_head().status;
    accounting_->answered(status);
    if (status != 200) co_return result::relay_answer;
    // The answer is read whole: the decode leg needs its kv_transfer_params.
    const auto read_ec = co_await read_whole_body();
    took_ = std::chrono::steady_clock::now() - sent_at;
    if (read_ec) {
      if (watch_.client_gone) {
        accounting_->finish(499);
        co_return result::client_gone;
      }
      const bool silent = read_ec == boost::beast::error::timeout;
      accounting_->attempt_failed("midstream", silent ? upstream::request_outcome::timeout : upstream::request_outcome::reset);
      failure_ = upstream_exchange::outcome{silent ? read_ec : boost::asio::error::connection_reset, "midstream", {}, false};
      co_return result::failed;
    }
    metrics::usage_scanner usage;
    usage.feed(answer_);
    accounting_->engine_finished(usage);
    exchange_.give_back_if_clean(accounting_->rank());
    params_ = pd::kv_transfer_params_of(answer_);
    // A 200 without them: an engine not configured for disaggregation (no --kv-transfer-config). Counted as
    // answered on the rank; the session tells the client what to fix.
    co_return params_ ? result::params_ready : result::failed;
  }

  std::string_view params() const noexcept { return params_.value_or(std::string_view{}); }
  upstream_exchange& exchange() noexcept { return exchange_; }
  request_accounting& accounting() noexcept { return *accounting_; }
  // Why the leg failed (result::failed), unless the engine answered 200 without kv_transfer_params.
  const upstream_exchange::outcome& failure() const noexcept { return failure_; }
  bool answered_without_params() const noexcept {
    return accounting_ && accounting_->current() == request_accounting::state::finished &&
           accounting_->status() == 200 && !params_;
  }
  // From the leg's sending to its answer's head (a relayed answer) or its whole answer; none without one.
  std::optional<std::chrono::steady_clock::duration> took() const noexcept { return took_; }

 private:
  // The rest of the engine's answer, into answer_, bounded by max_prefill_answer_bytes and by
  // --upstream-read-timeout-ms between reads.
  io::task<boost::system::error_code> read_whole_body() {
    namespace bhttp = boost::beast::http;
    auto& parser = exchange_.response();
    auto& connection = exchange_.connection();
    answer_.clear();
    while (!parser.is_done()) {
      const std::size_t used = answer_.size();
      if (used == max_prefill_answer_bytes) co_return bhttp::error::body_limit;
      answer_.resize(std::min(max_prefill_answer_bytes, used + io::large_block_size));
      parser.set_sink({answer_.data() + used, answer_.size() - used});
      auto ec = parse_buffered(parser, connection.buffer, [&] { return parser.is_done(); });
      answer_.resize(answer_.size() - parser.sink_left());
      if (parser.is_done() || ec == bhttp::error::need_buffer) continue;
      if (ec && ec != bhttp::error::need_more) co_return ec;
      deadline_.expires_after(shared_.settings.upstream_read_timeout);
      auto [read_ec, n] =
          co_await connection.stream.socket().async_read_some(connection.buffer.prepare(io::large_block_size), io::as_result);
      deadline_.expires_never();
      connection.buffer.commit(n);
      if (read_ec == boost::asio::error::eof) {
        parser.put_eof(ec);  // ends a body delimited by the close, and is an error for any other
        if (ec) co_return ec;
      } else if (read_ec) {
        co_return deadline_.expired() ? boost::system::error_code(boost::beast::error::timeout) : read_ec;
      }
    }
    co_return boost::system::error_code{};
  }

  shared_state& shared_;
  client_watch& watch_;
  upstream_exchange exchange_;
  socket_deadline& deadline_;
  balancer::pick_context request_;  // the pick over the prefill pool
  balancer::request_cost cost_;
  io::tcp_stream* client_ = nullptr;  // from acquire(): a retry that must wait for a prefill slot watches it
  queue_ticket ticket_;               // from acquire(): the request's place, for such a retry
  std::optional<request_accounting> accounting_;
  upstream_exchange::outcome failure_;
  std::string answer_;
  std::optional<std::string_view> params_;  // a view into answer_
  std::optional<std::chrono::steady_clock::duration> took_;
};

}  // namespace dplb::server
