// tests/attention/mailbox_comm.hpp — a minimal in-process Communicator for the attention tests:
// ranks are threads, point-to-point messages go through per-(src, dst) FIFO mailboxes (isend is
// buffered and completes at once; irecv completes at wait), all_to_all and all_gather are built on
// them, and every operation is logged with a timestamp so tests can check protocol invariants from
// outside (all_gather, the distributed calls' agreement check, logs one `collective` event only).
// Operations the attention code does not use throw. Waits time out (timeout_error), so a protocol
// bug fails the test instead of hanging it.
#pragma once

#include <weft/comm/concepts.hpp>
#include <weft/core/error.hpp>

#include <chrono>
#include <ctime>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace attention_testing {

namespace wc = weft::comm;

enum class event_kind { post_send, post_recv, wait_send, wait_recv, collective };

struct event {
  event_kind kind;
  int peer;
  std::size_t bytes;
  std::chrono::steady_clock::time_point at;
  std::chrono::nanoseconds cpu;  // the logging thread's CPU time: immune to preemption on a busy host
};

inline std::chrono::nanoseconds thread_cpu_time() noexcept {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return std::chrono::seconds(ts.tv_sec) + std::chrono::nanoseconds(ts.tv_nsec);
}

struct mailbox_world {
  explicit mailbox_world(int n, std::chrono::milliseconds limit = std::chrono::seconds(60))
      : size(n), timeout(limit), boxes(std::size_t(n * n)), logs(std::size_t(n)) {}
  int size;
  std::chrono::milliseconds timeout;
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::deque<std::vector<std::byte>>> boxes;  // index src * n + dst
  std::vector<std::vector<event>> logs;                    // per rank, written by that rank only
  bool aborted = false;
};

class mailbox_comm {
 public:
  using communicator_concept = wc::communicator_tag;

  mailbox_comm(std::shared_ptr<mailbox_world> w, int rank) : w_(std::move(w)), rank_(rank) {}

  [[nodiscard]] int rank() const noexcept { return rank_; }
  [[nodiscard]] int size() const noexcept { return w_->size; }
  [[nodiscard]] wc::comm_state state() const noexcept { return wc::comm_state::healthy; }

  wc::work isend(wc::buffer_view in, int peer, wc::op_options = {}) {
    check_peer(peer);
    log(event_kind::post_send, peer, in.bytes());
    post(in.data, in.bytes(), peer);
    return wc::work(std::make_shared<done_state>(this, peer, in.bytes()));
  }
  wc::work irecv(wc::buffer_view out, int peer, wc::op_options = {}) {
    check_peer(peer);
    log(event_kind::post_recv, peer, out.bytes());
    return wc::work(std::make_shared<recv_state>(this, out, peer));
  }
  wc::work send(wc::buffer_view in, int peer, wc::op_options o = {}) {
    auto w = isend(in, peer, o);
    w.wait();
    return {};
  }
  wc::work recv(wc::buffer_view out, int peer, wc::op_options o = {}) {
    auto w = irecv(out, peer, o);
    w.wait();
    return {};
  }
  wc::work all_to_all(wc::buffer_view in, wc::buffer_view out, wc::op_options = {}) {
    int const n = w_->size;
    std::size_t const chunk = in.bytes() / std::size_t(n);
    WEFT_EXPECTS(in.bytes() == out.bytes() && in.bytes() % std::size_t(n) == 0, "out",
                 in.bytes(), out.bytes());
    std::vector<wc::work> pending;
    for (int p = 0; p < n; ++p) {
      wc::buffer_view piece = in;
      piece.data = static_cast<std::byte*>(in.data) + chunk * std::size_t(p);
      piece.count = in.count / std::size_t(n);
      isend(piece, p);
    }
    for (int p = 0; p < n; ++p) {
      wc::buffer_view piece = out;
      piece.data = static_cast<std::byte*>(out.data) + chunk * std::size_t(p);
      piece.count = out.count / std::size_t(n);
      irecv(piece, p).wait();
    }
    return {};
  }

  [[noreturn]] static wc::work unsupported() {
    WEFT_THROW(weft::invalid_argument_error, "mailbox_comm: operation not provided by the test communicator");
  }
  wc::work all_reduce(wc::buffer_view, wc::buffer_view, wc::reduce_op, wc::op_options = {}) { unsupported(); }
  wc::work reduce(wc::buffer_view, wc::buffer_view, wc::reduce_op, int, wc::op_options = {}) { unsupported(); }
  wc::work broadcast(wc::buffer_view, wc::buffer_view, int, wc::op_options = {}) { unsupported(); }
  wc::work all_gather(wc::buffer_view in, wc::buffer_view out, wc::op_options = {}) {
    std::size_t const n = std::size_t(w_->size);
    WEFT_EXPECTS(out.bytes() == in.bytes() * n, "out", in.bytes() * n, out.bytes());
    log(event_kind::collective, -1, in.bytes());
    for (int p = 0; p < w_->size; ++p) post(in.data, in.bytes(), p);
    for (int p = 0; p < w_->size; ++p) take(static_cast<std::byte*>(out.data) + in.bytes() * std::size_t(p), in.bytes(), p);
    return {};
  }
  wc::work all_gather_v(wc::buffer_view, wc::buffer_view, std::span<std::size_t const>, wc::op_options = {}) { unsupported(); }
  wc::work reduce_scatter(wc::buffer_view, wc::buffer_view, wc::reduce_op, wc::op_options = {}) { unsupported(); }
  wc::work reduce_scatter_v(wc::buffer_view, wc::buffer_view, std::span<std::size_t const>, wc::reduce_op, wc::op_options = {}) { unsupported(); }
  wc::work all_to_all_v(wc::buffer_view, wc::buffer_view, std::span<std::size_t const>, std::span<std::size_t const>, wc::op_options = {}) { unsupported(); }
  wc::work gather(wc::buffer_view, wc::buffer_view, int, wc::op_options = {}) { unsupported(); }
  wc::work scatter(wc::buffer_view, wc::buffer_view, int, wc::op_options = {}) { unsupported(); }
  wc::work barrier(wc::op_options = {}) { unsupported(); }
  mailbox_comm split(int, int) { unsupported(); }
  void abort() noexcept {
    {
      std::lock_guard lk(w_->mu);
      w_->aborted = true;
    }
    w_->cv.notify_all();
  }
  [[nodiscard]] std::vector<wc::op_record> history() const { return {}; }
  void set_hook(wc::op_hook) {}

  [[nodiscard]] std::vector<event> const& events() const { return w_->logs[std::size_t(rank_)]; }

 private:
  void check_peer(int peer) const {
    WEFT_EXPECTS(peer >= 0 && peer < w_->size, "peer", "a rank of the group", peer);
  }
  // Unlogged transport: a message into the (rank, peer) mailbox, and the next one out of (peer, rank).
  void post(void const* data, std::size_t bytes, int peer) {
    std::vector<std::byte> msg(bytes);
    if (bytes) std::memcpy(msg.data(), data, bytes);
    {
      std::lock_guard lk(w_->mu);
      w_->boxes[std::size_t(rank_ * w_->size + peer)].push_back(std::move(msg));
    }
    w_->cv.notify_all();
  }
  void take(void* out, std::size_t bytes, int peer) {
    auto& w = *w_;
    std::unique_lock lk(w.mu);
    auto& box = w.boxes[std::size_t(peer * w.size + rank_)];
    if (!w.cv.wait_for(lk, w.timeout, [&] { return !box.empty() || w.aborted; }))
      throw weft::timeout_error("mailbox_comm: receive timed out", {peer});
    if (box.empty()) throw weft::peer_aborted_error("mailbox_comm: world aborted", peer);
    auto msg = std::move(box.front());
    box.pop_front();
    lk.unlock();
    WEFT_EXPECTS(msg.size() == bytes, "recv buffer", msg.size(), bytes);
    if (!msg.empty()) std::memcpy(out, msg.data(), msg.size());
  }
  void log(event_kind k, int peer, std::size_t bytes) {
    w_->logs[std::size_t(rank_)].push_back(
        {k, peer, bytes, std::chrono::steady_clock::now(), thread_cpu_time()});
  }

  struct done_state final : wc::detail::work_state {
    done_state(mailbox_comm* c, int p, std::size_t b) : comm(c), peer(p), bytes(b) {}
    mailbox_comm* comm;
    int peer;
    std::size_t bytes;
    bool logged = false;
    bool wait_until(std::chrono::steady_clock::time_point) override {
      if (!logged) comm->log(event_kind::wait_send, peer, bytes);
      logged = true;
      return true;
    }
    [[nodiscard]] bool done() const noexcept override { return true; }
  };

  struct recv_state final : wc::detail::work_state {
    recv_state(mailbox_comm* c, wc::buffer_view o, int p) : comm(c), out(o), peer(p) {}
    mailbox_comm* comm;
    wc::buffer_view out;
    int peer;
    bool complete = false;
    bool wait_until(std::chrono::steady_clock::time_point) override {
      if (complete) return true;
      comm->take(out.data, out.bytes(), peer);
      complete = true;
      comm->log(event_kind::wait_recv, peer, out.bytes());
      return true;
    }
    [[nodiscard]] bool done() const noexcept override { return complete; }
  };

  std::shared_ptr<mailbox_world> w_;
  int rank_;
};

static_assert(wc::Communicator<mailbox_comm>);

//! Runs f(comm) on n threads, one rank each; rethrows the first exception (after aborting the
//! world so that no rank stays blocked). Returns the per-rank event logs.
template <class F>
std::vector<std::vector<event>> run_mailbox_ranks(int n, F&& f) {
  auto world = std::make_shared<mailbox_world>(n);
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      mailbox_comm c(world, r);
      try {
        f(c);
      } catch (...) {
        errors[std::size_t(r)] = std::current_exception();
        c.abort();
      }
    });
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
  return world->logs;
}

}  // namespace attention_testing
