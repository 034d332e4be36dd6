// tests/attention/mailbox_comm.hpp — a small in-process collective communicator for the attention
// tests, modelling comm::CollectiveIn<C, host_space> (what Ulysses needs; ring attention needs only
// its PointToPoint part) and nothing more: ranks are threads, point-to-point messages go through
// per-(src, dst) FIFO mailboxes (isend is buffered and completes at once; irecv completes at
// wait), and every collective is built on them the simple way: each rank posts its contribution to
// every rank, takes every rank's, and computes its result locally (reductions by
// comm::reduce_reference). Every operation is logged with a timestamp so tests can check protocol
// invariants from outside; a collective logs one `collective` event only. Waits time out
// (timeout_error), so a protocol bug fails the test instead of hanging it.
#pragma once

#include <weft/comm/concepts.hpp>
#include <weft/comm/reference.hpp>
#include <weft/core/dtype.hpp>
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
#include <span>
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
  std::chrono::nanoseconds
      cpu;  // the logging thread's CPU time: immune to preemption on a busy host
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
  std::vector<std::vector<event>> logs;                   // per rank, written by that rank only
  bool aborted = false;
};

class mailbox_comm {
 public:
  using communicator_concept = wc::collective_tag;

  mailbox_comm(std::shared_ptr<mailbox_world> w, int rank) : w_(std::move(w)), rank_(rank) {}

  [[nodiscard]] int rank() const noexcept { return rank_; }
  [[nodiscard]] int size() const noexcept { return w_->size; }

  // ---- PointToPoint ----------------------------------------------------------------------------
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

  // ---- Collective: each posts to all, takes from all, computes locally
  // ---------------------------
  wc::work all_to_all(wc::buffer_view in, wc::buffer_view out, wc::op_options = {}) {
    std::size_t const n = std::size_t(w_->size);
    WEFT_EXPECTS(in.bytes() == out.bytes() && in.count % n == 0, "out", in.bytes(), out.bytes());
    std::vector<std::size_t> counts(n, in.count / n);
    return all_to_all_v(in, out, counts, counts);
  }
  wc::work all_to_all_v(wc::buffer_view in, wc::buffer_view out,
                        std::span<std::size_t const> send_counts,
                        std::span<std::size_t const> recv_counts, wc::op_options = {}) {
    log(event_kind::collective, -1, in.bytes());
    std::size_t const e = weft::size_of(in.type);
    std::size_t at = 0;
    for (int p = 0; p < w_->size; ++p) {
      post(bytes_of(in) + at * e, send_counts[std::size_t(p)] * e, p);
      at += send_counts[std::size_t(p)];
    }
    at = 0;
    for (int p = 0; p < w_->size; ++p) {
      take(bytes_of(out) + at * e, recv_counts[std::size_t(p)] * e, p);
      at += recv_counts[std::size_t(p)];
    }
    return {};
  }
  wc::work all_gather(wc::buffer_view in, wc::buffer_view out, wc::op_options = {}) {
    WEFT_EXPECTS(out.bytes() == in.bytes() * std::size_t(w_->size), "out",
                 in.bytes() * std::size_t(w_->size), out.bytes());
    std::vector<std::size_t> counts(std::size_t(w_->size), in.count);
    return all_gather_v(in, out, counts);
  }
  wc::work all_gather_v(wc::buffer_view in, wc::buffer_view out, std::span<std::size_t const>,
                        wc::op_options = {}) {
    concat(everyone(in), out);
    return {};
  }
  wc::work gather(wc::buffer_view in, wc::buffer_view out, int root, wc::op_options = {}) {
    auto all = everyone(in);
    if (rank_ == root) concat(all, out);
    return {};
  }
  wc::work broadcast(wc::buffer_view in, wc::buffer_view out, int root, wc::op_options = {}) {
    auto all = everyone(in);
    copy_out(all[std::size_t(root)].data(), out, 0, out.count);
    return {};
  }
  wc::work scatter(wc::buffer_view in, wc::buffer_view out, int root, wc::op_options = {}) {
    auto all = everyone(in);
    copy_out(all[std::size_t(root)].data(), out, std::size_t(rank_) * out.count, out.count);
    return {};
  }
  wc::work all_reduce(wc::buffer_view in, wc::buffer_view out, wc::reduce_op op,
                      wc::op_options = {}) {
    reduce_into(everyone(in), op, out, 0);
    return {};
  }
  wc::work reduce(wc::buffer_view in, wc::buffer_view out, wc::reduce_op op, int root,
                  wc::op_options = {}) {
    auto all = everyone(in);
    if (rank_ == root) reduce_into(std::move(all), op, out, 0);
    return {};
  }
  wc::work reduce_scatter(wc::buffer_view in, wc::buffer_view out, wc::reduce_op op,
                          wc::op_options = {}) {
    reduce_into(everyone(in), op, out, std::size_t(rank_) * out.count);
    return {};
  }
  wc::work reduce_scatter_v(wc::buffer_view in, wc::buffer_view out,
                            std::span<std::size_t const> counts, wc::reduce_op op,
                            wc::op_options = {}) {
    std::size_t offset = 0;
    for (int p = 0; p < rank_; ++p) offset += counts[std::size_t(p)];
    reduce_into(everyone(in), op, out, offset);
    return {};
  }
  wc::work barrier(wc::op_options = {}) {
    (void)everyone(wc::buffer_view{});
    return {};
  }

  //! Not part of any concept: wakes every rank blocked in a receive (run_mailbox_ranks calls it
  //! when a rank throws, so the others fail instead of waiting for the timeout).
  void abort() noexcept {
    {
      std::lock_guard lk(w_->mu);
      w_->aborted = true;
    }
    w_->cv.notify_all();
  }

  [[nodiscard]] std::vector<event> const& events() const { return w_->logs[std::size_t(rank_)]; }

 private:
  void check_peer(int peer) const {
    WEFT_EXPECTS(peer >= 0 && peer < w_->size, "peer", "a rank of the group", peer);
  }
  static std::byte* bytes_of(wc::buffer_view b) noexcept { return static_cast<std::byte*>(b.data); }

  // Every rank posts `in` to every rank and takes every rank's contribution, in rank order.
  std::vector<std::vector<std::byte>> everyone(wc::buffer_view in) {
    log(event_kind::collective, -1, in.bytes());
    for (int p = 0; p < w_->size; ++p) post(in.data, in.bytes(), p);
    std::vector<std::vector<std::byte>> all(std::size_t(w_->size));
    for (int p = 0; p < w_->size; ++p) all[std::size_t(p)] = take_message(p);
    return all;
  }
  void concat(std::vector<std::vector<std::byte>> const& all, wc::buffer_view out) {
    std::size_t at = 0;
    for (auto const& m : all) {
      WEFT_EXPECTS(at + m.size() <= out.bytes(), "out", "room for every rank's block", out.bytes());
      if (!m.empty()) std::memcpy(bytes_of(out) + at, m.data(), m.size());
      at += m.size();
    }
  }
  // out = elements [first, first + count) of a contribution.
  static void copy_out(std::byte const* from, wc::buffer_view out, std::size_t first,
                       std::size_t count) {
    std::size_t const e = weft::size_of(out.type);
    if (count) std::memcpy(out.data, from + first * e, count * e);
  }
  // out = elements [first, first + out.count) of the reduction over ranks (comm::reduce_reference).
  static void reduce_into(std::vector<std::vector<std::byte>> all, wc::reduce_op op,
                          wc::buffer_view out, std::size_t first) {
    weft::dispatch(out.type, [&](auto type) {
      using T = typename decltype(type)::type;
      std::vector<T const*> inputs;
      for (auto const& m : all) inputs.push_back(reinterpret_cast<T const*>(m.data()) + first);
      wc::reduce_reference<T>(std::span<T const* const>(inputs), op,
                              std::span<T>(static_cast<T*>(out.data), out.count));
    });
  }

  // Unlogged transport: a message into the (rank, peer) mailbox, and the next one out of (peer,
  // rank).
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
    auto msg = take_message(peer);
    WEFT_EXPECTS(msg.size() == bytes, "recv buffer", msg.size(), bytes);
    if (!msg.empty()) std::memcpy(out, msg.data(), msg.size());
  }
  std::vector<std::byte> take_message(int peer) {
    auto& w = *w_;
    std::unique_lock lk(w.mu);
    auto& box = w.boxes[std::size_t(peer * w.size + rank_)];
    if (!w.cv.wait_for(lk, w.timeout, [&] { return !box.empty() || w.aborted; }))
      throw weft::timeout_error("mailbox_comm: receive timed out", {peer});
    if (box.empty()) throw weft::peer_aborted_error("mailbox_comm: world aborted", peer);
    auto msg = std::move(box.front());
    box.pop_front();
    return msg;
  }
  void log(event_kind k, int peer, std::size_t bytes) {
    w_->logs[std::size_t(rank_)].push_back(
        {k, peer, bytes, std::chrono::steady_clock::now(), thread_cpu_time()});
  }

  struct done_state final : wc::work_state {
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

  struct recv_state final : wc::work_state {
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

static_assert(wc::CollectiveIn<mailbox_comm, weft::host_space>);
static_assert(!wc::Communicator<mailbox_comm>);  // no split, state, history: Ulysses needs none

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

//! Runs f(ulysses_comm, ring_comm, g) on u·r threads, one USP rank each: rank g = rho·u + upsilon
//! is rank upsilon of Ulysses group rho (the u consecutive ranks) and rank rho of ring group
//! upsilon (strided). Rethrows the first exception, after aborting both of its worlds.
template <class F>
void run_usp_ranks(int u, int r, F&& f) {
  std::vector<std::shared_ptr<mailbox_world>> uw, rw;
  for (int i = 0; i < r; ++i) uw.push_back(std::make_shared<mailbox_world>(u));
  for (int i = 0; i < u; ++i) rw.push_back(std::make_shared<mailbox_world>(r));
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(u * r));
  std::vector<std::thread> threads;
  for (int g = 0; g < u * r; ++g)
    threads.emplace_back([&, g] {
      int const rho = g / u, ups = g % u;
      mailbox_comm uc(uw[std::size_t(rho)], ups), rc(rw[std::size_t(ups)], rho);
      try {
        f(uc, rc, g);
      } catch (...) {
        errors[std::size_t(g)] = std::current_exception();
        uc.abort();
        rc.abort();
      }
    });
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

}  // namespace attention_testing
