#pragma once
// Private to the session: the answers dplb writes itself rather than relays from an engine. OpenAI-style
// JSON errors (a refusal, a request it could not read, a rank that failed before answering), its own paths
// (/metrics, /health) and, with clusters that list models, GET /v1/models. Each is counted and, under
// --access-log, noted as answered by dplb; each says whether the connection stays open after it.

#include <boost/asio/write.hpp>
#include <boost/beast/http.hpp>

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

#include "dplb/http/error_response.hpp"
#include "dplb/server/deadline_sweeper.hpp"
#include "dplb/server/proxy_context.hpp"
#include "dplb/support/io_types.hpp"
#include "access_record.hpp"
#include "tenant_pass.hpp"

namespace dplb::server {

class own_replies {
 public:
  using string_response = boost::beast::http::response<boost::beast::http::string_body>;

  own_replies(io::tcp_stream& client, socket_deadline& deadline, shared_state& shared, access_record& access,
              tenant_pass& tenant)
      : client_(client), deadline_(deadline), shared_(shared), access_(access), tenant_(tenant) {}

  // The HTTP version of the request being answered: how a response says it keeps the connection open.
  void set_client_version(unsigned version) noexcept { client_version_ = version; }
  unsigned client_version() const noexcept { return client_version_; }

  // A refusal before any rank was involved: counted among dplb_rejected_total{status}.
  io::task<bool> reject(unsigned status, std::string_view message, bool keep_alive) {
    shared_.metrics.rejected(status);
    co_return co_await send_error(status, message, keep_alive);
  }

  // An OpenAI-style error (as vLLM writes them); `retry_after` (seconds, when above 0) adds a Retry-After,
  // `param` names the field at fault, `code` is a string code in place of the status (http::error_body).
  // Counting is the caller's (a rank's failure is counted by its accounting), but for the request's tenant,
  // which send() counts (tenant_pass counts a request once).
  io::task<bool> send_error(unsigned status, std::string_view message, bool keep_alive, std::int64_t retry_after = 0,
                            std::string_view param = {}, std::string_view code = {}) {
    string_response response{static_cast<boost::beast::http::status>(status), 11};
    response.set(boost::beast::http::field::content_type, "application/json");
    if (retry_after > 0) response.set(boost::beast::http::field::retry_after, std::to_string(retry_after));
    // A 401 names the scheme that would be accepted (RFC 9110 11.6.1).
    if (status == 401) response.set(boost::beast::http::field::www_authenticate, "Bearer");
    response.body() = http::error_body(status, message, param, code);
    co_return co_await send(response, keep_alive, false);
  }

  // Why a request is refused before it reaches a rank: a status and its message, or a request that could not
  // be read whole (refuse_unreadable decides). The session answers every such refusal at one place, since
  // each co_await takes room of its own in the caller's coroutine frame (see session::serve_one_request).
  struct refusal {
    unsigned status = 0;  // with `message`; 0: see `unreadable`
    std::string_view message = {};
    bool keep_alive = false;
    boost::system::error_code unreadable = {};
    bool got_some = false;  // part of the unreadable request arrived
  };
  static refusal unreadable(const boost::system::error_code& ec, bool got_some) {
    return refusal{.unreadable = ec, .got_some = got_some};
  }

  io::task<bool> refuse(refusal r) {
    if (r.status == 0) co_return co_await refuse_unreadable(r.unreadable, r.got_some);
    co_return co_await reject(r.status, r.message, r.keep_alive);
  }

  // A request that could not be read whole: the status that says why, or a quiet close when the client
  // went away or stayed idle.
  io::task<bool> refuse_unreadable(const boost::system::error_code& ec, bool got_some) {
    namespace bhttp = boost::beast::http;
    if (ec == bhttp::error::header_limit) {
      co_return co_await reject(431, "request head exceeds the limit (--max-header-bytes)", false);
    }
    if (ec == bhttp::error::body_limit) {
      co_return co_await reject(413, "request body exceeds the limit (--max-request-body-bytes)", false);
    }
    if (ec == boost::beast::error::timeout && got_some) {
      // A request started but not finished in time (slowloris). The stream's deadline has closed the
      // socket already, so, as nginx does, the 408 is only counted, never sent.
      shared_.metrics.rejected(408);
      tenant_.answered(408);
      if (shared_.access_log) access_.answered_by_dplb(408, 0);
      co_return false;
    }
    if (ec.category() == bhttp::make_error_code(bhttp::error::bad_version).category() &&
        ec != bhttp::error::end_of_stream && ec != bhttp::error::partial_message) {
      co_return co_await reject(400, "malformed HTTP request: " + ec.message(), false);
    }
    co_return false;
  }

  // /metrics and /health, on the proxy's own listener.
  io::task<bool> own_path(boost::beast::http::verb method, std::string_view path, bool keep_alive) {
    namespace bhttp = boost::beast::http;
    const bool head_request = method == bhttp::verb::head;
    if (method != bhttp::verb::get && !head_request) {
      string_response response{bhttp::status::method_not_allowed, 11};
      response.set(bhttp::field::allow, "GET, HEAD");
      response.set(bhttp::field::content_type, "application/json");
      response.body() = http::error_body(405, std::string(path) + " only answers GET");
      co_return co_await send(response, keep_alive, false);
    }
    string_response response{bhttp::status::ok, 11};
    if (path == "/metrics") {
      response.set(bhttp::field::content_type, "text/plain; version=0.0.4; charset=utf-8");
      response.body() = shared_.metrics.render();
    } else if (shared_.draining.load(std::memory_order_relaxed)) {
      response.result(bhttp::status::service_unavailable);
      response.set(bhttp::field::content_type, "application/json");
      response.body() = http::error_body(503, "dplb is shutting down");
    } else if (!shared_.balancer.any_usable()) {
      response.result(bhttp::status::service_unavailable);
      response.set(bhttp::field::content_type, "application/json");
      response.set(bhttp::field::retry_after, "1");
      response.body() = http::error_body(503, "no backend rank is usable");
    }
    co_return co_await send(response, keep_alive, head_request);
  }

  // With clusters no one engine knows every model: dplb answers GET /v1/models with their union.
  io::task<bool> models_list(boost::beast::http::verb method, bool keep_alive) {
    namespace bhttp = boost::beast::http;
    string_response response{bhttp::status::ok, 11};
    response.set(bhttp::field::content_type, "application/json");
    const auto now = std::chrono::system_clock::now().time_since_epoch();
    response.body() = shared_.models.models_list(std::chrono::duration_cast<std::chrono::seconds>(now).count());
    co_return co_await send(response, keep_alive, method == bhttp::verb::head);
  }

 private:
  io::task<bool> send(string_response& response, bool keep_alive, bool head_request) {
    keep_alive = keep_alive && !shared_.draining.load(std::memory_order_relaxed);  // a drain closes after it
    set_connection_header(response, keep_alive);
    response.prepare_payload();
    if (head_request) response.body().clear();  // Content-Length still tells the size of a GET
    if (shared_.access_log) access_.answered_by_dplb(response.result_int(), response.body().size());
    tenant_.answered(response.result_int());  // the request's tenant's, if it has one (tenant_pass counts it once)
    deadline_.expires_after(shared_.settings.client_write_timeout);
    auto [ec, n] = co_await boost::beast::http::async_write(client_.socket(), response, io::as_result);
    deadline_.expires_never();
    co_return !ec && keep_alive;
  }

  // As the relay says it (connection_field): an HTTP/1.0 client is told the connection stays open, an
  // HTTP/1.1 client that it closes.
  void set_connection_header(string_response& response, bool keep_alive) const {
    namespace bhttp = boost::beast::http;
    if (!keep_alive) {
      response.set(bhttp::field::connection, "close");
    } else if (client_version_ < 11) {
      response.set(bhttp::field::connection, "keep-alive");
    } else {
      response.erase(bhttp::field::connection);
    }
  }

  io::tcp_stream& client_;
  socket_deadline& deadline_;
  shared_state& shared_;
  access_record& access_;
  tenant_pass& tenant_;  // the request's tenant: counted with the answer
  unsigned client_version_ = 11;
};

}  // namespace dplb::server
