// weft/comm/mpi/detail/state.hpp — what an MPI-backend communicator and its pending work share:
// the MPI_Comm and its ownership, the first fault, the history, the buffers of abandoned requests;
// polling requests to a deadline; and the pending work of isend/irecv.
#pragma once

#if !WEFT_HAS_MPI
#error \
    "weft/comm/mpi/detail/state.hpp needs MPI: link the CMake target weft::mpi (it defines WEFT_HAS_MPI=1 and adds MPI's include path and libraries)"
#endif

#include <weft/comm/concepts.hpp>
#include <weft/comm/detail/describe.hpp>
#include <weft/comm/detail/fault.hpp>
#include <weft/comm/detail/history.hpp>
#include <weft/comm/detail/poll.hpp>
#include <weft/comm/mpi/detail/wire.hpp>
#include <weft/comm/mpi/options.hpp>
#include <weft/core/error.hpp>

#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace weft::comm::mpi::detail {

namespace rules = weft::comm::detail;

struct shared {
  MPI_Comm comm = MPI_COMM_NULL;
  bool owned = false;
  MPI_Errhandler saved_handler = MPI_ERRHANDLER_NULL;  // restored on an adopted comm
  int rank = -1;
  int size = 0;
  options opts;
  std::uint64_t seq = 0;
  std::atomic<comm_state> state{comm_state::healthy};
  rules::fault why;
  std::vector<std::shared_ptr<void>> keep;  // staging buffers of a dead request
  bool abandoned = false;        // a request was left posted (MPI cannot cancel a collective)
  bool split = false;            // made by split: messages give world ranks beside group ranks
  std::vector<int> world_ranks;  // rank in MPI_COMM_WORLD of each rank (split communicators)
  std::string name;              // the group's name in messages (a mesh axis); set_name()
  rules::op_history history;

  [[nodiscard]] rules::group_names names() const { return {split, world_ranks, name}; }
  //! "rank 1", or in a split communicator "rank 1 (world rank 3)".
  [[nodiscard]] std::string who(int r) const { return names().who(r); }

  ~shared() {
    int fin = 0;
    MPI_Finalized(&fin);
    if (comm == MPI_COMM_NULL || fin != 0) return;
    if (!keep.empty()) bury(std::move(keep));
    if (owned && abandoned) {
      // A request left posted still uses the communicator when its late peer arrives (Open MPI's
      // libnbc sends its next round on it, even inside MPI_Finalize): freeing it here crashed
      // there. It is left to MPI_Finalize.
    } else if (owned) {
      MPI_Comm_free(&comm);
    } else if (saved_handler != MPI_ERRHANDLER_NULL) {
      MPI_Comm_set_errhandler(comm, saved_handler);
      MPI_Errhandler_free(&saved_handler);
    }
  }

  //! Every call on a dead communicator: peer_aborted_error after a local abort(), else the first
  //! fault's exception.
  [[noreturn]] void rethrow_fault(std::string const& context) const {
    if (state.load(std::memory_order_acquire) == comm_state::aborted)
      rules::throw_aborted(context, who(rank), rank);
    rules::rethrow(why, context + " on a poisoned communicator");
  }
  void poison(rules::fault f) {
    if (state.load() == comm_state::healthy) {
      why = std::move(f);
      state.store(comm_state::poisoned);
    }
  }
};

// Tests `reqs` until all complete, `until` passes or the communicator is aborted; MPI progresses
// inside MPI_Testall. MPI errors throw backend_error.
inline rules::poll_result poll(shared const& s, std::vector<MPI_Request>& reqs,
                               clock::time_point until) {
  std::vector<MPI_Status> st(reqs.size());
  auto test = [&] {
    int flag = 0;
    int const rc = MPI_Testall(static_cast<int>(reqs.size()), reqs.data(), &flag, st.data());
    if (rc != MPI_SUCCESS) {
      int code = rc;
      if (rc == MPI_ERR_IN_STATUS)
        for (auto const& x : st)
          if (x.MPI_ERROR != MPI_SUCCESS && x.MPI_ERROR != MPI_ERR_PENDING) {
            code = x.MPI_ERROR;
            break;
          }
      throw backend_error(weft::detail::concat("MPI_Testall failed: ", mpi_error_text(code)), "mpi",
                          code);
    }
    return flag != 0;
  };
  auto aborted = [&] { return s.state.load(std::memory_order_acquire) == comm_state::aborted; };
  return rules::poll_until(until, test, aborted);
}

//! Pending isend/irecv: polls its requests; the deadline is the communicator's.
class p2p_work final : public rules::work_state {
 public:
  p2p_work(std::shared_ptr<shared> s, std::vector<MPI_Request> reqs, std::uint64_t record_id,
           op_record rec, clock::time_point deadline, std::chrono::milliseconds timeout,
           std::shared_ptr<std::byte[]> owned = {}, void* user_out = nullptr,
           std::size_t out_bytes = 0)
      : s_(std::move(s)),
        reqs_(std::move(reqs)),
        record_id_(record_id),
        rec_(std::move(rec)),
        deadline_(deadline),
        timeout_(timeout),
        owned_(std::move(owned)),
        user_out_(user_out),
        out_bytes_(out_bytes) {}
  ~p2p_work() override {
    // Never waited for, or abandoned: the request may still use weft's buffer and communicator.
    if (!finished_ || error_) {
      s_->abandoned = true;
      if (owned_) s_->keep.push_back(std::move(owned_));
    }
  }

  bool wait_until(clock::time_point until) override;
  [[nodiscard]] bool done() const noexcept override {
    if (finished_) return true;
    int flag = 0;
    // Probing here also drives MPI's progress; an error is reported by wait().
    if (MPI_Testall(static_cast<int>(reqs_.size()), reqs_.data(), &flag, MPI_STATUSES_IGNORE) !=
        MPI_SUCCESS)
      return true;
    return flag != 0;
  }

 private:
  std::shared_ptr<shared> s_;
  mutable std::vector<MPI_Request> reqs_;
  std::uint64_t record_id_;
  op_record rec_;
  clock::time_point deadline_;
  std::chrono::milliseconds timeout_;
  std::shared_ptr<std::byte[]> owned_;  // weft's copy of the message (options::own_buffers)
  void* user_out_ = nullptr;            // where a received message goes once complete
  std::size_t out_bytes_ = 0;
  bool finished_ = false;
  std::exception_ptr error_;  // a failure already thrown once, thrown again by later waits
};

inline bool p2p_work::wait_until(clock::time_point until) {
  if (finished_) {
    if (error_) std::rethrow_exception(error_);
    return true;
  }
  rules::poll_result r = rules::poll_result::done;
  rules::fault f;
  try {
    r = poll(*s_, reqs_, std::min(until, deadline_));
  } catch (backend_error const& e) {
    f = {errc::backend, e.message(), s_->rank, {}, "mpi", e.backend_code()};
  }
  bool const failed = f.kind == errc::backend;
  if (!failed && r == rules::poll_result::deadline && until < deadline_) return false;
  if (!failed && r == rules::poll_result::done) {
    finished_ = true;
    if (out_bytes_ != 0) std::memcpy(user_out_, owned_.get(), out_bytes_);
    owned_.reset();
    rec_.end = clock::now();
    s_->history.completed(record_id_, rec_);
    return true;
  }
  std::string context = s_->names().context(rec_.op, s_->rank, 0);
  if (!failed && r == rules::poll_result::stopped) {
    f = rules::aborted_fault(s_->who(s_->rank), s_->rank);
    context += " on an aborted communicator";
  } else if (!failed) {
    f = {errc::timeout,
         weft::detail::concat(to_string(rec_.op), " with peer ", rec_.root_or_peer, " on ",
                              s_->who(s_->rank), s_->names().label(), " timed out after ",
                              timeout_.count(), " ms: ", s_->who(rec_.root_or_peer),
                              " did not take part"),
         s_->rank,
         {rec_.root_or_peer},
         {},
         0};
    context.clear();  // the message names the call
    s_->poison(f);
  } else {
    s_->poison(f);
  }
  for (auto& q : reqs_)
    if (q != MPI_REQUEST_NULL && rec_.op == op_kind::recv) MPI_Cancel(&q);
  finished_ = true;
  try {
    rules::rethrow(f, context);
  } catch (comm_error const& e) {
    error_ = std::current_exception();
    rules::mark_failed(rec_, e.what());
    s_->history.completed(record_id_, rec_);
    throw;
  }
}

}  // namespace weft::comm::mpi::detail
