// weft/comm/threads/detail/p2p.hpp — what one threads-backend rank keeps for itself (sequence
// numbers, deadline, history, its outstanding point-to-point halves) and the pending work of an
// isend/irecv: it waits for the peer to complete the match, or fails at the deadline, when the
// peer departs, or when the group is poisoned.
#pragma once

#include <weft/comm/concepts.hpp>
#include <weft/comm/detail/fault.hpp>
#include <weft/comm/detail/history.hpp>
#include <weft/comm/threads/detail/group.hpp>
#include <weft/comm/threads/detail/parking.hpp>
#include <weft/core/error.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace weft::comm::threads::detail {

//! What one rank keeps for itself: sequence numbers, its deadline, its history and hook. Shared
//! with its pending work so that a work outliving a moved communicator still finds it.
struct rank_state {
  std::string name;       // the group's name in messages (a mesh axis); set_name()
  std::uint64_t seq = 0;  // collectives that synchronised (zero-length ones do not count)
  std::vector<std::uint64_t> send_seq;
  std::vector<std::uint64_t> recv_seq;
  std::chrono::milliseconds timeout{0};
  std::atomic<bool> aborted{false};
  std::vector<std::weak_ptr<p2p_op>> outstanding;  // this rank's p2p halves, possibly pending
  weft::comm::detail::op_history history;
};

class p2p_work final : public weft::comm::detail::work_state {
 public:
  p2p_work(std::shared_ptr<group> g, std::shared_ptr<p2p_op> op, std::shared_ptr<rank_state> st,
           std::uint64_t record_id, op_record rec, clock::time_point deadline,
           std::chrono::milliseconds timeout, int rank)
      : group_(std::move(g)),
        op_(std::move(op)),
        state_(std::move(st)),
        record_id_(record_id),
        rec_(std::move(rec)),
        deadline_(deadline),
        timeout_(timeout),
        rank_(rank) {}

  [[nodiscard]] bool done() const noexcept override {
    return op_->state.load(std::memory_order_acquire) == p2p_op::done;
  }

  bool wait_until(clock::time_point caller_deadline) override {
    for (;;) {
      int const st = op_->state.load(std::memory_order_acquire);
      if (st == p2p_op::done) {
        complete(true, {});
        return true;
      }
      if (st == p2p_op::failed || st == p2p_op::cancelled) rethrow_failure();
      if (st == p2p_op::claimed) {
        // The peer is copying; that is bounded, so wait for it without a deadline.
        group_->park().wait_until(
            [&] { return op_->state.load(std::memory_order_acquire) != p2p_op::claimed; },
            clock::time_point::max());
        continue;
      }
      // pending
      if (group_->faulted()) {
        if (cancel()) fail_with(group_->fault());
        continue;
      }
      int const peer = op_->is_send ? op_->dst : op_->src;
      if (group_->departed(peer)) {
        if (cancel()) {
          fault_info f;
          f.kind = errc::peer_aborted;
          f.origin = peer;
          f.missing = {peer};
          f.message = weft::detail::concat(
              op_->is_send ? "send" : "recv", " #", op_->seq, " (dtype ", op_->type, ", count ",
              op_->count, ") ", op_->is_send ? "to" : "from", " ", who(*group_, peer), " on ",
              who(*group_, rank_), ": ", who(*group_, peer),
              " has finished (its function returned or its communicator was destroyed) without "
              "posting the matching ",
              op_->is_send ? "recv" : "send");
          group_->fail(f);
          fail_with(f);
        }
        continue;
      }
      auto const now = clock::now();
      if (now >= deadline_) {
        if (cancel()) {
          fault_info f;
          f.kind = errc::timeout;
          f.origin = rank_;
          f.missing = {peer};
          f.message = weft::detail::concat(
              op_->is_send ? "send" : "recv", " #", op_->seq, " (dtype ", op_->type, ", count ",
              op_->count, ") ", op_->is_send ? "to" : "from", " ", who(*group_, peer),
              " timed out after ", timeout_.count(), " ms on ", who(*group_, rank_), ": ",
              who(*group_, peer), " did not post the matching ", op_->is_send ? "recv" : "send",
              " (missing ranks ", ranks(*group_, {peer}), ")");
          group_->fail(f);
          fail_with(f);
        }
        continue;
      }
      if (now >= caller_deadline) return false;
      group_->park().wait_until(
          [&] {
            return op_->state.load(std::memory_order_acquire) != p2p_op::pending ||
                   group_->faulted() || group_->departed(peer);
          },
          std::min(deadline_, caller_deadline));
    }
  }

 private:
  // Takes a pending op out of its queue so that nobody copies from or into it any more.
  bool cancel() {
    std::lock_guard<std::mutex> lock(group_->p2p_mutex);
    if (op_->state.load(std::memory_order_acquire) != p2p_op::pending) return false;
    auto& q = op_->is_send ? group_->sends(op_->src, op_->dst) : group_->recvs(op_->src, op_->dst);
    std::erase(q, op_);
    op_->state.store(p2p_op::cancelled, std::memory_order_release);
    return true;
  }

  [[noreturn]] void fail_with(fault_info const& f) {
    std::string const ctx =
        weft::detail::concat(op_->is_send ? "isend" : "irecv", " on ", who(*group_, rank_),
                             group_label(*group_, state_->name), " (message #", op_->seq, ")");
    try {
      weft::comm::detail::rethrow(f, ctx);
    } catch (comm_error const&) {
      error_ = std::current_exception();
      complete(false, error_);
      throw;
    }
  }

  [[noreturn]] void rethrow_failure() {
    if (!error_) {
      // Failed by the peer that matched us (mismatch): it left the reason in the op.
      fault_info f;
      f.kind = op_->error_kind;
      f.origin = -1;
      f.message = op_->error;
      if (f.kind == errc::comm && group_->faulted()) f = group_->fault();
      fail_with(f);
    }
    std::rethrow_exception(error_);
  }

  void complete(bool ok, std::exception_ptr const& e) {
    if (completed_) return;
    completed_ = true;
    rec_.end = clock::now();
    rec_.ok = ok;
    if (e) {
      try {
        std::rethrow_exception(e);
      } catch (std::exception const& x) {
        rec_.error = x.what();
      } catch (...) {}
    }
    state_->history.completed(record_id_, rec_);
  }

  std::shared_ptr<group> group_;
  std::shared_ptr<p2p_op> op_;
  std::shared_ptr<rank_state> state_;
  std::uint64_t record_id_;
  op_record rec_;
  clock::time_point deadline_;
  std::chrono::milliseconds timeout_;
  int rank_;
  bool completed_ = false;
  std::exception_ptr error_;
};

}  // namespace weft::comm::threads::detail
