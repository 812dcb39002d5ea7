#include "raw_engine.hpp"

#include "text.hpp"
#include "timing_slack.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <stdexcept>

namespace dplb::test {

using clock_type = std::chrono::steady_clock;

raw_action write_bytes(std::string bytes) { return raw_action{raw_action::kind::write, std::move(bytes), {}}; }
raw_action pause_for(std::chrono::milliseconds duration) { return raw_action{raw_action::kind::pause, {}, duration}; }
raw_action close_connection() { return raw_action{raw_action::kind::close, {}, {}}; }
raw_action reset_connection() { return raw_action{raw_action::kind::reset, {}, {}}; }

namespace {

// Header lines of a head (the start line skipped), as name and trimmed value.
std::vector<std::pair<std::string_view, std::string_view>> header_lines(std::string_view head) {
  std::vector<std::pair<std::string_view, std::string_view>> out;
  auto line_end = head.find("\r\n");
  if (line_end == std::string_view::npos) return out;
  head.remove_prefix(line_end + 2);
  while ((line_end = head.find("\r\n")) != std::string_view::npos && line_end > 0) {
    const auto line = head.substr(0, line_end);
    const auto colon = line.find(':');
    if (colon != std::string_view::npos) out.emplace_back(line.substr(0, colon), trim(line.substr(colon + 1)));
    head.remove_prefix(line_end + 2);
  }
  return out;
}

// A number in the given base, the whole text of it; nullopt for anything else (the engine never throws
// on a connection's thread, it treats an unreadable request as the end of the connection).
std::optional<std::size_t> parse_number(std::string_view text, int base) {
  std::size_t value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value, base);
  if (ec != std::errc() || end != text.data() + text.size() || text.empty()) return std::nullopt;
  return value;
}

bool send_all(int fd, std::string_view bytes) {
  while (!bytes.empty()) {
    const auto n = ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    bytes.remove_prefix(static_cast<std::size_t>(n));
  }
  return true;
}

}  // namespace

std::string_view raw_request::method() const {
  return std::string_view(head).substr(0, head.find(' '));
}

std::string_view raw_request::target() const {
  const auto start = head.find(' ');
  if (start == std::string::npos) return {};
  const auto end = head.find(' ', start + 1);
  return std::string_view(head).substr(start + 1, end == std::string::npos ? std::string::npos : end - start - 1);
}

std::vector<std::string> raw_request::header_values(std::string_view name) const {
  std::vector<std::string> out;
  for (const auto& [n, v] : header_lines(head)) {
    if (iequals(n, name)) out.emplace_back(v);
  }
  return out;
}

std::optional<std::string> raw_request::header(std::string_view name) const {
  auto values = header_values(name);
  if (values.empty()) return std::nullopt;
  return values.front();
}

raw_engine::raw_engine(raw_script script) : script_(std::move(script)) {
  listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (listen_fd_ < 0) throw std::runtime_error(std::string("raw engine: socket: ") + std::strerror(errno));
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = 0;
  socklen_t length = sizeof address;
  if (::bind(listen_fd_, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0 ||
      ::listen(listen_fd_, 64) != 0 ||
      ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    const std::string why = std::strerror(errno);
    ::close(listen_fd_);
    throw std::runtime_error("raw engine: cannot listen on 127.0.0.1: " + why);
  }
  port_ = ntohs(address.sin_port);
  accept_thread_ = std::thread([this] { accept_loop(); });
}

raw_engine::~raw_engine() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
    // Wakes every blocked accept, recv and send: they fail, their threads see stopping_ and end.
    ::shutdown(listen_fd_, SHUT_RDWR);
    for (auto& c : connections_) {
      if (c.fd >= 0) ::shutdown(c.fd, SHUT_RDWR);
    }
  }
  changed_.notify_all();  // and every scripted pause
  accept_thread_.join();
  // No thread is added once the accept loop has ended.
  for (auto& t : connection_threads_) t.join();
  for (std::size_t i = 0; i < connections_.size(); ++i) close_fd(i, false);
  ::close(listen_fd_);
}

std::string raw_engine::url() const { return "http://127.0.0.1:" + std::to_string(port_); }

void raw_engine::accept_loop() {
  for (;;) {
    // Bounded polls: shutdown() of a listening socket wakes accept on Linux, and this keeps the loop
    // correct even where it would not.
    pollfd p{listen_fd_, POLLIN, 0};
    const int ready = ::poll(&p, 1, 50);
    {
      std::lock_guard lock(mutex_);
      if (stopping_) return;
    }
    if (ready <= 0) continue;
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    const int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    std::lock_guard lock(mutex_);
    if (stopping_) {
      ::close(fd);
      return;
    }
    const std::size_t index = connections_.size();
    connections_.push_back(connection_state{fd, false, {}, {}});
    connection_threads_.emplace_back([this, index] { serve(index); });
    changed_.notify_all();
  }
}

void raw_engine::serve(std::size_t connection) {
  int fd;
  {
    std::lock_guard lock(mutex_);
    fd = connections_[connection].fd;
  }
  std::string buffer;
  for (std::size_t index = 0;; ++index) {
    bool malformed = false;
    auto request = read_request(fd, buffer, malformed);
    if (malformed) {
      close_fd(connection, true);  // not HTTP this engine can frame: nothing to answer, and not a peer close
      return;
    }
    if (!request) {
      std::lock_guard lock(mutex_);
      if (!stopping_) {
        auto& state = connections_[connection];
        state.peer_closed = true;
        state.peer_closed_at = clock_type::now();
        state.unfinished = buffer;
      }
      changed_.notify_all();
      return;
    }
    request->connection = connection;
    request->index_on_connection = index;
    request->received_at = clock_type::now();
    {
      std::lock_guard lock(mutex_);
      requests_.push_back(*request);
    }
    changed_.notify_all();
    std::vector<raw_action> actions;
    try {
      actions = script_(*request);
    } catch (const std::exception&) {
      // A script that cannot answer must not take the test process down with it (an exception on
      // this thread would terminate it): the connection is reset, which the test then sees.
      actions = {reset_connection()};
    }
    if (!perform(connection, actions)) return;
  }
}

bool raw_engine::perform(std::size_t connection, const std::vector<raw_action>& actions) {
  int fd;
  {
    std::lock_guard lock(mutex_);
    fd = connections_[connection].fd;
  }
  for (const auto& action : actions) {
    switch (action.what) {
      case raw_action::kind::write:
        if (!send_all(fd, action.bytes)) return false;
        break;
      case raw_action::kind::pause:
        if (!pause_unless_closed(connection, fd, action.pause)) return false;
        break;
      case raw_action::kind::close:
        close_fd(connection, false);
        return false;
      case raw_action::kind::reset:
        close_fd(connection, true);
        return false;
    }
  }
  return true;
}

bool raw_engine::pause_unless_closed(std::size_t connection, int fd, std::chrono::milliseconds pause) {
  // Only the peer's close (or an error) wakes the poll: bytes arriving (a pipelined request) wait for the
  // script. The destructor shuts the socket down, which wakes it too.
  const auto until = clock_type::now() + pause;
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - clock_type::now());
    if (left.count() <= 0) return true;
    pollfd watched{fd, POLLRDHUP, 0};
    const int ready = ::poll(&watched, 1, static_cast<int>(std::min<std::int64_t>(left.count(), 1000)));
    if (ready < 0 && errno == EINTR) continue;
    if (ready == 0) continue;
    std::lock_guard lock(mutex_);
    if (!stopping_) {
      auto& state = connections_[connection];
      state.peer_closed = true;
      state.peer_closed_at = clock_type::now();
    }
    changed_.notify_all();
    return false;
  }
}

void raw_engine::close_fd(std::size_t connection, bool with_reset) {
  std::lock_guard lock(mutex_);
  auto& state = connections_[connection];
  if (state.fd < 0) return;
  if (with_reset) {
    const linger abort_on_close{1, 0};
    ::setsockopt(state.fd, SOL_SOCKET, SO_LINGER, &abort_on_close, sizeof abort_on_close);
  } else {
    ::shutdown(state.fd, SHUT_RDWR);
  }
  ::close(state.fd);
  state.fd = -1;
}

bool raw_engine::receive_more(int fd, std::string& buffer) {
  char chunk[16 * 1024];
  for (;;) {
    const auto n = ::recv(fd, chunk, sizeof chunk, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    buffer.append(chunk, static_cast<std::size_t>(n));
    return true;
  }
}

std::optional<raw_request> raw_engine::read_request(int fd, std::string& buffer, bool& malformed) {
  const auto need = [&](std::size_t bytes) {
    while (buffer.size() < bytes) {
      if (!receive_more(fd, buffer)) return false;
    }
    return true;
  };
  // Up to and including the line ending that starts at or after `from`; npos when the peer closed.
  const auto line_end = [&](std::size_t from) {
    for (;;) {
      const auto at = buffer.find("\r\n", from);
      if (at != std::string::npos) return at + 2;
      if (!receive_more(fd, buffer)) return std::string::npos;
    }
  };

  raw_request request;
  std::size_t head_end;
  while ((head_end = buffer.find("\r\n\r\n")) == std::string::npos) {
    if (!receive_more(fd, buffer)) return std::nullopt;
  }
  request.head = buffer.substr(0, head_end + 4);

  std::optional<std::size_t> content_length;
  for (const auto& [name, value] : header_lines(request.head)) {
    if (iequals(name, "content-length")) {
      content_length = parse_number(value, 10);
      if (!content_length) {
        malformed = true;
        return std::nullopt;
      }
    }
    if (iequals(name, "transfer-encoding") && value.find("chunked") != std::string_view::npos) request.chunked = true;
  }
  std::size_t at = head_end + 4;
  if (request.chunked) {
    for (;;) {
      const auto size_end = line_end(at);
      if (size_end == std::string::npos) return std::nullopt;
      auto size_line = std::string_view(buffer).substr(at, size_end - 2 - at);
      size_line = size_line.substr(0, size_line.find(';'));  // chunk extensions are not needed
      const auto parsed = parse_number(trim(size_line), 16);
      if (!parsed) {
        malformed = true;
        return std::nullopt;
      }
      const std::size_t size = *parsed;
      at = size_end;
      if (size == 0) break;
      if (!need(at + size + 2)) return std::nullopt;
      request.body.append(buffer, at, size);
      at += size + 2;
    }
    // Trailer lines, then the empty line that ends the message.
    for (;;) {
      const auto end = line_end(at);
      if (end == std::string::npos) return std::nullopt;
      if (end - at == 2) {
        at = end;
        break;
      }
      request.trailers.append(buffer, at, end - at);
      at = end;
    }
  } else if (content_length) {
    if (!need(at + *content_length)) return std::nullopt;
    request.body = buffer.substr(at, *content_length);
    at += *content_length;
  }
  buffer.erase(0, at);
  return request;
}

template <class Pred>
bool raw_engine::await(std::chrono::milliseconds deadline, Pred pred) {
  std::unique_lock lock(mutex_);
  return changed_.wait_for(lock, scaled(deadline), pred);
}

bool raw_engine::await_requests(std::size_t count, std::chrono::milliseconds deadline) {
  return await(deadline, [&] { return requests_.size() >= count; });
}

bool raw_engine::await_accepted(std::size_t count, std::chrono::milliseconds deadline) {
  return await(deadline, [&] { return connections_.size() >= count; });
}

bool raw_engine::await_peer_close(std::size_t connection, std::chrono::milliseconds deadline) {
  return await(deadline, [&] { return connection < connections_.size() && connections_[connection].peer_closed; });
}

std::vector<raw_request> raw_engine::requests() const {
  std::lock_guard lock(mutex_);
  return requests_;
}

std::size_t raw_engine::request_count() const {
  std::lock_guard lock(mutex_);
  return requests_.size();
}

std::size_t raw_engine::accepted_count() const {
  std::lock_guard lock(mutex_);
  return connections_.size();
}

std::optional<clock_type::time_point> raw_engine::peer_closed_at(std::size_t connection) const {
  std::lock_guard lock(mutex_);
  if (connection >= connections_.size() || !connections_[connection].peer_closed) return std::nullopt;
  return connections_[connection].peer_closed_at;
}

std::string raw_engine::unfinished_bytes(std::size_t connection) const {
  std::lock_guard lock(mutex_);
  return connection < connections_.size() ? connections_[connection].unfinished : std::string();
}

}  // namespace dplb::test
