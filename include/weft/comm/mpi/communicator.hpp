// weft/comm/mpi/communicator.hpp — the MPI backend: a Communicator over an MPI_Comm it duplicates
// or adopts (host memory only). Every operation is a non-blocking MPI call polled to a deadline;
// bf16/f16 reduce in f32, counts above INT_MAX are chunked, fingerprints are checked on request.
#pragma once

#if !WEFT_HAS_MPI
#  error "weft/comm/mpi/communicator.hpp needs MPI: link the CMake target weft::mpi (it defines WEFT_HAS_MPI=1 and adds MPI's include path and libraries)"
#endif

#include <weft/comm/concepts.hpp>
#include <weft/comm/detail/checked.hpp>
#include <weft/comm/reference.hpp>
#include <weft/core/dtype.hpp>
#include <weft/core/error.hpp>
#include <weft/core/memory.hpp>

#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

namespace weft::comm::mpi {

//! Settings of one communicator (inherited by split). All ranks must use the same values.
struct options {
  //! Deadline of every operation unless a call passes op_options::timeout. A peer that does not
  //! take part within it makes this rank throw timeout_error (and poisons the communicator).
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};
  //! How many operations history() keeps (0 keeps none).
  std::size_t history_size = 64;
  //! Debug mode: before each collective, all-gather its fingerprint (op, dtype, count, root,
  //! reduction, sequence, _v counts) and throw mismatch_error on every rank if they differ. Costs
  //! one small extra collective per call.
  bool check_fingerprints = false;
  //! Largest element count (and displacement) handed to one MPI call; MPI counts are `int`, so
  //! larger operations are split into chunks. Lower it only to exercise the chunked paths.
  std::size_t max_count = static_cast<std::size_t>(INT_MAX);
  //! Data moves through buffers weft owns: inputs are copied in before the MPI call, results
  //! copied out after it completes. MPI cannot cancel a collective, so a request that outlives its
  //! deadline stays posted and writes (or reads) its buffers whenever the late peer arrives, even
  //! inside MPI_Finalize; with weft's buffers (kept for the rest of the process once a request is
  //! abandoned) the caller may free its own after a timeout_error, return and finalize. false:
  //! MPI works on the caller's buffers directly (one copy less each way), and after a
  //! timeout_error those stay on loan to MPI: keep them alive until MPI_Finalize returns, or end
  //! the job with MPI_Abort.
  bool own_buffers = true;
};

//! Optional RAII for programs that own MPI: MPI_Init_thread in the constructor (if MPI is not
//! initialised yet), MPI_Finalize in the destructor (if this object initialised it).
class environment {
 public:
  environment(int* argc, char*** argv, int required = MPI_THREAD_SERIALIZED) {
    int inited = 0;
    MPI_Initialized(&inited);
    if (inited != 0) return;
    int provided = 0;
    WEFT_MPI_TRY(MPI_Init_thread(argc, argv, required, &provided));
    owner_ = true;
    provided_ = provided;
  }
  environment(environment const&) = delete;
  environment& operator=(environment const&) = delete;
  ~environment() {
    int fin = 0;
    MPI_Finalized(&fin);
    if (owner_ && fin == 0) MPI_Finalize();
  }
  [[nodiscard]] int provided() const noexcept { return provided_; }

 private:
  bool owner_ = false;
  int provided_ = MPI_THREAD_SINGLE;
};

namespace detail {

using clock = std::chrono::steady_clock;

// User p2p and the internal point-to-point paths (chunked fallbacks) use distinct tags on the
// same MPI communicator: both are below the 32767 every MPI implementation must allow.
inline constexpr int user_tag = 30000;
inline constexpr int internal_tag = 30001;

inline std::string rank_list(std::vector<int> const& v) {
  std::string s = "[";
  for (std::size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

inline std::string mpi_error_text(int code) {
  char text[MPI_MAX_ERROR_STRING] = {};
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) len = 0;
  int cls = 0;
  if (MPI_Error_class(code, &cls) != MPI_SUCCESS) cls = code;
  return weft::detail::concat(std::string_view(text, static_cast<std::size_t>(len)),
                              " (MPI error class ", cls, ")");
}

// Buffers an MPI request may still write after its communicator died (a timed-out collective
// cannot be cancelled): kept alive for the rest of the process rather than freed under MPI.
inline void bury(std::vector<std::shared_ptr<void>>&& keep) {
  static auto* graveyard = new std::vector<std::shared_ptr<void>>();  // never freed, on purpose
  static std::atomic_flag lock = ATOMIC_FLAG_INIT;
  while (lock.test_and_set(std::memory_order_acquire)) std::this_thread::yield();
  for (auto& k : keep) graveyard->push_back(std::move(k));
  lock.clear(std::memory_order_release);
}

// ---- element types on the wire ---------------------------------------------------------------

// The 16-bit floats travel as 2-byte words (Open MPI 4.1 has no fp16/bf16 datatype).
inline MPI_Datatype half_word_type() {
  static MPI_Datatype t = [] {
    MPI_Datatype d = MPI_DATATYPE_NULL;
    WEFT_MPI_TRY(MPI_Type_contiguous(2, MPI_BYTE, &d));
    WEFT_MPI_TRY(MPI_Type_commit(&d));
    return d;
  }();
  return t;
}

//! The MPI datatype that moves elements of `t` (no arithmetic implied).
inline MPI_Datatype move_type(dtype t) {
  switch (t) {
    case dtype::f32: return MPI_FLOAT;
    case dtype::f64: return MPI_DOUBLE;
    case dtype::bf16:
    case dtype::f16: return half_word_type();
    case dtype::i32: return MPI_INT32_T;
    case dtype::i64: return MPI_INT64_T;
    case dtype::u8: return MPI_UINT8_T;
  }
  weft::detail::throw_bad_dtype(t);
}

// User op: inout[i] = combine(in[i], inout[i]) with weft's semantics (NaN-propagating min/max;
// 16-bit floats compared as f32 and stored back exactly).
template <class W, reduce_kind K>
void user_combine(void* in, void* inout, int* len, MPI_Datatype*) {
  using R = reducer<W, K>;
  auto const* a = static_cast<W const*>(in);
  auto* b = static_cast<W*>(inout);
  for (int i = 0; i < *len; ++i) {
    if constexpr (std::is_same_v<W, u8>) {
      b[i] = R::combine(a[i], b[i]);  // wrapping (combine works on the unsigned type)
    } else if constexpr (std::is_same_v<W, bf16> || std::is_same_v<W, f16>) {
      // min/max only: the f32 result is one of the two inputs, so the rounding is exact.
      b[i] = W(R::combine(static_cast<float>(a[i]), static_cast<float>(b[i])));
    } else {
      b[i] = R::combine(a[i], b[i]);
    }
  }
}

template <class W, reduce_kind K>
MPI_Op user_op() {
  static MPI_Op op = [] {
    MPI_Op o = MPI_OP_NULL;
    WEFT_MPI_TRY(MPI_Op_create(&user_combine<W, K>, 1, &o));
    return o;
  }();
  return op;
}

//! How a reduction of element type T travels: the wire element W (the accumulator for sums and
//! products, so bf16/f16 accumulate in f32 and round once at the end), its datatype and op.
template <Element T, reduce_kind K>
struct wire {
  static constexpr bool extremum = K == reduce_kind::min || K == reduce_kind::max;
  // min/max are exact in the element type, so 16-bit floats travel as themselves.
  using type = std::conditional_t<extremum, T, accumulator_t<T>>;
  static MPI_Datatype datatype() {
    if constexpr (std::is_same_v<type, float>) {
      return MPI_FLOAT;
    } else if constexpr (std::is_same_v<type, double>) {
      return MPI_DOUBLE;
    } else if constexpr (std::is_same_v<type, bf16> || std::is_same_v<type, f16>) {
      return half_word_type();
    } else if constexpr (!extremum) {
      // Integer sums and products wrap (two's complement): computed on the unsigned type, where
      // MPI's C arithmetic is defined.
      if constexpr (sizeof(type) == 4) return MPI_UINT32_T;
      else if constexpr (sizeof(type) == 8) return MPI_UINT64_T;
      else return MPI_UINT8_T;
    } else {
      if constexpr (std::is_same_v<type, i32>) return MPI_INT32_T;
      else if constexpr (std::is_same_v<type, i64>) return MPI_INT64_T;
      else return MPI_UINT8_T;
    }
  }
  static MPI_Op op() {
    if constexpr (std::is_same_v<type, u8> && !extremum) {
      // Open MPI 4.1's AVX component saturates 8-bit sums (255 + 1 == 255); weft wraps.
      return user_op<u8, K == reduce_kind::prod ? reduce_kind::prod : reduce_kind::sum>();
    } else if constexpr (K == reduce_kind::prod) {
      return MPI_PROD;
    } else if constexpr (extremum) {
      if constexpr (std::is_integral_v<type>) return K == reduce_kind::min ? MPI_MIN : MPI_MAX;
      else return user_op<type, K>();
    } else {
      return MPI_SUM;  // sum, avg (divided afterwards), premul_sum (scaled before)
    }
  }
  // The input must be converted (or scaled) into a wire buffer first.
  static constexpr bool staged_in = !std::is_same_v<type, T> || K == reduce_kind::premul_sum;
  // The result must be converted (or divided) from the wire afterwards.
  static constexpr bool staged_out = !std::is_same_v<type, T>;
  static constexpr bool finish = !std::is_same_v<type, T> || K == reduce_kind::avg;
};

// ---- the shared state of one communicator -----------------------------------------------------

struct fault {
  errc kind = errc::comm;
  std::string message;
  std::vector<int> missing;
};

struct shared {
  MPI_Comm comm = MPI_COMM_NULL;
  bool owned = false;
  MPI_Errhandler saved_handler = MPI_ERRHANDLER_NULL;  // restored on an adopted comm
  int rank = -1;
  int size = 0;
  options opts;
  std::uint64_t seq = 0;
  std::atomic<comm_state> state{comm_state::healthy};
  fault why;
  std::vector<std::shared_ptr<void>> keep;  // staging buffers of a dead request
  bool abandoned = false;  // a request was left posted (MPI cannot cancel a collective)
  bool split = false;            // made by split: messages give world ranks beside group ranks
  std::vector<int> world_ranks;  // rank in MPI_COMM_WORLD of each rank (split communicators)
  std::string name;              // the group's name in messages (a mesh axis); set_name()

  //! "rank 1", or in a split communicator "rank 1 (world rank 3)".
  [[nodiscard]] std::string who(int r) const {
    if (!split || r < 0 || static_cast<std::size_t>(r) >= world_ranks.size())
      return "rank " + std::to_string(r);
    return weft::detail::concat("rank ", r, " (world rank ", world_ranks[static_cast<std::size_t>(r)], ")");
  }
  //! "" for a world; " of group `tp`" (named) or " of the group of world ranks [..]" for a split.
  [[nodiscard]] std::string label() const {
    if (!split) return {};
    if (!name.empty()) return " of group `" + name + "`";
    std::vector<int> shown;
    for (std::size_t i = 0; i < world_ranks.size() && i < 16; ++i) shown.push_back(world_ranks[i]);
    return " of the group of world ranks " + rank_list(shown) + (world_ranks.size() > 16 ? " ..." : "");
  }

  std::vector<op_record> ring;
  std::uint64_t recorded = 0;
  op_hook hook;

  std::uint64_t add(op_record const& r) {
    std::uint64_t const id = recorded++;
    std::size_t const cap = opts.history_size;
    if (cap == 0) return id;
    if (ring.size() < cap) ring.push_back(r);
    else ring[static_cast<std::size_t>(id % cap)] = r;
    return id;
  }
  void update(std::uint64_t id, op_record const& r) {
    std::size_t const cap = opts.history_size;
    if (cap == 0 || id + cap < recorded) return;
    ring[static_cast<std::size_t>(id % cap)] = r;
  }
  [[nodiscard]] std::vector<op_record> history() const {
    std::vector<op_record> out;
    if (opts.history_size == 0) return out;
    std::uint64_t const first = recorded - ring.size();
    for (std::uint64_t id = first; id < recorded; ++id)
      out.push_back(ring[static_cast<std::size_t>(id % opts.history_size)]);
    return out;
  }
  void call_hook(op_record const& r, bool rethrow) {
    if (!hook) return;
    if (rethrow) {
      hook(r);
      return;
    }
    try {
      hook(r);
    } catch (...) {  // the communication error is the one reported
    }
  }

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

  [[noreturn]] void rethrow_fault(std::string const& context) const {
    std::string const msg = context + ": " + why.message;
    switch (why.kind) {
      case errc::timeout: throw timeout_error(msg, why.missing);
      case errc::mismatch: throw mismatch_error(msg);
      case errc::backend: throw backend_error(msg, "mpi", 0);
      default: throw comm_error(msg);
    }
  }
  void poison(fault f) {
    if (state.load() == comm_state::healthy) {
      why = std::move(f);
      state.store(comm_state::poisoned);
    }
  }
};

//! Pending isend/irecv: polls its requests; the deadline is the communicator's.
class p2p_work final : public comm::detail::work_state {
 public:
  p2p_work(std::shared_ptr<shared> s, std::vector<MPI_Request> reqs, std::uint64_t record_id,
           op_record rec, clock::time_point deadline, std::chrono::milliseconds timeout,
           std::shared_ptr<std::byte[]> owned = {}, void* user_out = nullptr, std::size_t out_bytes = 0)
      : s_(std::move(s)), reqs_(std::move(reqs)), record_id_(record_id), rec_(std::move(rec)),
        deadline_(deadline), timeout_(timeout), owned_(std::move(owned)), user_out_(user_out),
        out_bytes_(out_bytes) {}
  ~p2p_work() override {
    // Never waited for, or abandoned: the request may still use weft's buffer and communicator.
    if (!finished_ || !error_.empty()) {
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
  void* user_out_ = nullptr;             // where a received message goes once complete
  std::size_t out_bytes_ = 0;
  bool finished_ = false;
  std::string error_;  // a failure already thrown once, thrown again by later waits
  errc error_kind_ = errc::comm;
};

enum class poll_result { done, deadline, aborted };

// Tests `reqs` until all complete, `until` passes or the communicator is aborted. Waits between
// tests (yield, then sleeps growing to 200 us) so a rank waiting for a late peer does not burn a
// core; MPI progresses inside MPI_Testall. MPI errors throw backend_error.
inline poll_result poll(shared const& s, std::vector<MPI_Request>& reqs, clock::time_point until) {
  std::vector<MPI_Status> st(reqs.size());
  for (unsigned k = 0;; ++k) {
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
    if (flag != 0) return poll_result::done;
    if (s.state.load(std::memory_order_acquire) == comm_state::aborted) return poll_result::aborted;
    if (clock::now() >= until) return poll_result::deadline;
    if (k < 32) {
      std::this_thread::yield();
    } else {
      auto const us = std::min<unsigned>(200u, 5u << std::min<unsigned>((k - 32) / 16, 6));
      std::this_thread::sleep_for(std::chrono::microseconds(us));
    }
  }
}

inline bool p2p_work::wait_until(clock::time_point until) {
  if (finished_) {
    if (!error_.empty()) {
      if (error_kind_ == errc::timeout) throw timeout_error(error_);
      throw comm_error(error_);
    }
    return true;
  }
  auto const limit = std::min(until, deadline_);
  poll_result r = poll_result::done;
  std::string err;
  errc kind = errc::comm;
  std::vector<int> missing;
  try {
    r = poll(*s_, reqs_, limit);
  } catch (backend_error const& e) {
    err = e.message();
    kind = errc::backend;
  }
  if (err.empty() && r == poll_result::deadline && until < deadline_) return false;  // caller's limit
  if (err.empty() && r == poll_result::done) {
    finished_ = true;
    if (out_bytes_ != 0) std::memcpy(user_out_, owned_.get(), out_bytes_);
    owned_.reset();
    rec_.end = clock::now();
    s_->update(record_id_, rec_);
    s_->call_hook(rec_, true);
    return true;
  }
  if (err.empty() && r == poll_result::aborted) {
    err = weft::detail::concat(to_string(rec_.op), " on ", s_->who(s_->rank), s_->label(),
                               ": the communicator was aborted");
  } else if (err.empty()) {
    kind = errc::timeout;
    missing = {rec_.root_or_peer};
    err = weft::detail::concat(to_string(rec_.op), " with peer ", rec_.root_or_peer, " on ",
                               s_->who(s_->rank), s_->label(), " timed out after ", timeout_.count(),
                               " ms: ", s_->who(rec_.root_or_peer), " did not take part");
    s_->poison({errc::timeout, err, missing});
  } else {
    err = weft::detail::concat(to_string(rec_.op), " on ", s_->who(s_->rank), s_->label(), ": ", err);
    s_->poison({errc::backend, err, {}});
  }
  for (auto& q : reqs_)
    if (q != MPI_REQUEST_NULL && rec_.op == op_kind::recv) MPI_Cancel(&q);
  finished_ = true;
  error_ = err;
  error_kind_ = kind;
  rec_.end = clock::now();
  rec_.ok = false;
  rec_.error = err;
  s_->update(record_id_, rec_);
  s_->call_hook(rec_, false);
  if (kind == errc::timeout) throw timeout_error(err, missing);
  if (kind == errc::backend) throw backend_error(err, "mpi", 0);
  throw comm_error(err);
}

inline bool overlap(buffer_view const& a, buffer_view const& b) noexcept {
  if (a.count == 0 || b.count == 0) return false;
  auto const a0 = reinterpret_cast<std::uintptr_t>(a.data);
  auto const b0 = reinterpret_cast<std::uintptr_t>(b.data);
  return a0 < b0 + b.bytes() && b0 < a0 + a.bytes();
}

inline std::byte* at(void const* p, std::size_t elements, dtype t) noexcept {
  return static_cast<std::byte*>(const_cast<void*>(p)) + elements * size_of(t);
}

inline std::vector<std::size_t> exclusive_sums(std::span<std::size_t const> counts) {
  std::vector<std::size_t> off(counts.size() + 1, 0);
  for (std::size_t i = 0; i < counts.size(); ++i) off[i + 1] = off[i] + counts[i];
  return off;
}

}  // namespace detail

//! A rank of an MPI communicator. Models Communicator over host memory:
//!  - create one with communicator::world() / dup(parent) (collective; owns an MPI_Comm_dup of the
//!    parent) or adopt(comm) (local; uses the caller's MPI_Comm without owning it, installs
//!    MPI_ERRORS_RETURN on it and restores the previous handler on destruction);
//!  - every operation is a non-blocking MPI call polled with MPI_Testall until done or the
//!    deadline (options::timeout, or op_options::timeout per call); blocking calls return
//!    completed work, isend/irecv return pending work;
//!  - count 0 is a local no-op, not a synchronisation point (barrier and split always are);
//!  - reductions follow reference.hpp: bf16/f16 sums and products accumulate in f32 and round
//!    once, integer sums and products wrap, min/max propagate NaN, avg and premul_sum as
//!    documented there; the order of the combination is MPI's, so float results may differ from
//!    the rank-ordered reference in the last bits (exact inputs give exact results);
//!  - a fault (deadline, MPI error, fingerprint mismatch) throws on the rank that detects it and
//!    poisons its communicator. MPI cannot wake or cancel the peers' pending collectives: they
//!    time out in turn, or the program ends with MPI_Abort (weft never calls it);
//!  - one thread uses a communicator (and its work) at a time; abort() may come from any thread.
//! A default-constructed or moved-from communicator, or one from split with a negative color, is
//! a non-member: size() == 0, rank() == -1, and every operation throws invalid_argument_error.
class communicator {
 public:
  using communicator_concept = communicator_tag;
  using memory_space = host_space;

  communicator() = default;
  communicator(communicator&&) noexcept = default;
  communicator& operator=(communicator&&) noexcept = default;
  communicator(communicator const&) = delete;
  communicator& operator=(communicator const&) = delete;
  ~communicator() = default;

  //! Collective over `parent`: a new communicator owning MPI_Comm_idup(parent), waited for with
  //! the options' deadline.
  [[nodiscard]] static communicator dup(MPI_Comm parent, options opts = {}) {
    WEFT_EXPECTS(parent != MPI_COMM_NULL, "parent", "a valid MPI communicator", "MPI_COMM_NULL");
    check_options(opts);
    MPI_Comm c = MPI_COMM_NULL;
    MPI_Request req = MPI_REQUEST_NULL;
    WEFT_MPI_TRY(MPI_Comm_idup(parent, &c, &req));
    auto s = std::make_shared<detail::shared>();
    s->opts = opts;
    std::vector<MPI_Request> reqs{req};
    auto const r = detail::poll(*s, reqs, detail::clock::now() + opts.timeout);
    if (r != detail::poll_result::done)
      throw timeout_error(weft::detail::concat("MPI_Comm_idup timed out after ", opts.timeout.count(),
                                               " ms: not every rank of the parent communicator took part"));
    s->comm = c;
    s->owned = true;
    WEFT_MPI_TRY(MPI_Comm_set_errhandler(c, MPI_ERRORS_RETURN));
    return communicator(std::move(s));
  }

  //! A communicator over MPI_COMM_WORLD (a duplicate: weft's traffic never meets the caller's).
  [[nodiscard]] static communicator world(options opts = {}) { return dup(MPI_COMM_WORLD, opts); }

  //! Local: uses `comm` without owning it (the caller frees it after this object is gone).
  //! weft's point-to-point traffic on it uses tags 30000 and 30001.
  [[nodiscard]] static communicator adopt(MPI_Comm comm, options opts = {}) {
    WEFT_EXPECTS(comm != MPI_COMM_NULL, "comm", "a valid MPI communicator", "MPI_COMM_NULL");
    check_options(opts);
    auto s = std::make_shared<detail::shared>();
    s->opts = opts;
    s->comm = comm;
    s->owned = false;
    WEFT_MPI_TRY(MPI_Comm_get_errhandler(comm, &s->saved_handler));
    WEFT_MPI_TRY(MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN));
    return communicator(std::move(s));
  }

  [[nodiscard]] int rank() const noexcept { return s_ ? s_->rank : -1; }
  [[nodiscard]] int size() const noexcept { return s_ ? s_->size : 0; }
  [[nodiscard]] comm_state state() const noexcept {
    return s_ ? s_->state.load(std::memory_order_acquire) : comm_state::healthy;
  }
  //! The wrapped communicator (MPI_COMM_NULL for a non-member).
  [[nodiscard]] MPI_Comm native() const noexcept { return s_ ? s_->comm : MPI_COMM_NULL; }
  [[nodiscard]] options const& opts() const noexcept {
    static options const none{};
    return s_ ? s_->opts : none;
  }
  [[nodiscard]] std::chrono::milliseconds timeout() const noexcept {
    return s_ ? s_->opts.timeout : std::chrono::milliseconds{0};
  }
  void set_timeout(std::chrono::milliseconds t) {
    WEFT_EXPECTS(t.count() > 0, "timeout", "> 0 ms", t.count());
    if (s_) s_->opts.timeout = t;
  }
  //! The name that errors raised in this communicator give its group ("tp": device_mesh names
  //! each axis group after its axis). Errors in a communicator made by split name the group and
  //! give each rank they mention as "rank 1 (world rank 3)".
  void set_name(std::string name) {
    if (s_) s_->name = std::move(name);
  }
  [[nodiscard]] std::string const& name() const noexcept {
    static std::string const none;
    return s_ ? s_->name : none;
  }
  //! Turns the debug-mode fingerprint check on or off; every rank must do the same.
  void set_check_fingerprints(bool on) noexcept {
    if (s_) s_->opts.check_fingerprints = on;
  }

  [[nodiscard]] std::vector<op_record> history() const {
    return s_ ? s_->history() : std::vector<op_record>{};
  }
  //! Called with the record of every operation when it completes or fails. A hook that throws on
  //! success propagates to the caller; on failure it is ignored (the comm_error wins).
  void set_hook(op_hook hook) {
    if (s_) s_->hook = std::move(hook);
  }

  //! Marks the communicator aborted: pending waits on this rank stop and every later call throws.
  //! Idempotent. It cannot reach the peers (MPI 3.1 has no revoke): they time out.
  void abort() noexcept {
    if (!s_) return;
    comm_state h = comm_state::healthy;
    s_->state.compare_exchange_strong(h, comm_state::aborted);
    if (h == comm_state::poisoned) s_->state.store(comm_state::aborted);
  }

  // ---- reductions ------------------------------------------------------------------------------

  work all_reduce(buffer_view in, buffer_view out, reduce_op op = {}, op_options o = {}) {
    call c = begin(op_kind::all_reduce, o);
    check_buffer(in, "in");
    check_buffer(out, "out");
    check_same_type(in, out);
    WEFT_EXPECTS_SHAPE(out.count == in.count, "out.count", in.count, out.count);
    check_in_place_or_disjoint(in, out, in.data == out.data, "out == in (in-place)");
    validate_reduce_op(op, in.type);
    c.fp = {op_kind::all_reduce, in.type, in.count, -1, op.kind, 0};
    c.rec.send_bytes = in.bytes();
    c.rec.recv_bytes = out.bytes();
    if (in.count == 0) return finish_trivial(c);
    return run_staged(c, in, out, true, true, [&] { reduce_into(c, in, out, op, -1); });
  }

  work reduce(buffer_view in, buffer_view out, reduce_op op, int root, op_options o = {}) {
    call c = begin(op_kind::reduce, o);
    check_rank(root, "root");
    check_buffer(in, "in");
    bool const is_root = root == rank();
    if (is_root) {
      check_buffer(out, "out");
      check_same_type(in, out);
      WEFT_EXPECTS_SHAPE(out.count == in.count, "out.count (on the root)", in.count, out.count);
      check_in_place_or_disjoint(in, out, in.data == out.data, "out == in (in-place)");
    }
    validate_reduce_op(op, in.type);
    c.fp = {op_kind::reduce, in.type, in.count, root, op.kind, 0};
    c.rec.root_or_peer = root;
    c.rec.send_bytes = in.bytes();
    c.rec.recv_bytes = is_root ? in.bytes() : 0;
    if (in.count == 0) return finish_trivial(c);
    return run_staged(c, in, out, true, is_root,
                      [&] { reduce_into(c, in, is_root ? out : in, op, root); });
  }

  work reduce_scatter(buffer_view in, buffer_view out, reduce_op op = {}, op_options o = {}) {
    call c = begin(op_kind::reduce_scatter, o);
    check_buffer(in, "in");
    check_buffer(out, "out");
    check_same_type(in, out);
    auto const n = static_cast<std::size_t>(size());
    WEFT_EXPECTS_SHAPE(in.count == weft::comm::detail::checked_mul(n, out.count, "size() * out.count"), "in.count",
                       weft::detail::concat("size() * out.count = ", weft::comm::detail::checked_mul(n, out.count, "size() * out.count")), in.count);
    check_in_place_or_disjoint(in, out, out.data == detail::at(in.data, me() * out.count, in.type),
                               "out == in + rank() * out.count (in-place)");
    validate_reduce_op(op, in.type);
    c.fp = {op_kind::reduce_scatter, in.type, out.count, -1, op.kind, 0};
    c.rec.send_bytes = in.bytes();
    c.rec.recv_bytes = out.bytes();
    if (out.count == 0) return finish_trivial(c);
    std::vector<std::size_t> counts(n, out.count);
    return run_staged(c, in, out, true, true, [&] { reduce_scatter_into(c, in, out, counts, op); });
  }

  work reduce_scatter_v(buffer_view in, buffer_view out, std::span<std::size_t const> counts,
                        reduce_op op = {}, op_options o = {}) {
    call c = begin(op_kind::reduce_scatter_v, o);
    check_counts(counts, "counts");
    check_buffer(in, "in");
    check_buffer(out, "out");
    check_same_type(in, out);
    auto const off = weft::comm::detail::checked_offsets(counts, in.type, "counts");
    WEFT_EXPECTS_SHAPE(in.count == off.back(), "in.count", weft::detail::concat("sum(counts) = ", off.back()),
                       in.count);
    WEFT_EXPECTS_SHAPE(out.count == counts[me()], "out.count",
                       weft::detail::concat("counts[rank()] = ", counts[me()]), out.count);
    check_in_place_or_disjoint(in, out, out.data == detail::at(in.data, off[me()], in.type),
                               "out == in + counts[0] + ... + counts[rank()-1] (in-place)");
    validate_reduce_op(op, in.type);
    c.fp = {op_kind::reduce_scatter_v, in.type, off.back(), -1, op.kind, 0};
    c.counts.assign(counts.begin(), counts.end());
    c.rec.send_bytes = in.bytes();
    c.rec.recv_bytes = out.bytes();
    if (off.back() == 0) return finish_trivial(c);
    return run_staged(c, in, out, true, true, [&] { reduce_scatter_into(c, in, out, counts, op); });
  }

  // ---- data movement ---------------------------------------------------------------------------

  work broadcast(buffer_view in, buffer_view out, int root, op_options o = {}) {
    call c = begin(op_kind::broadcast, o);
    check_rank(root, "root");
    check_buffer(out, "out");
    bool const is_root = root == rank();
    if (is_root) {
      check_buffer(in, "in");
      check_same_type(in, out);
      WEFT_EXPECTS_SHAPE(in.count == out.count, "in.count (on the root)", out.count, in.count);
      check_in_place_or_disjoint(in, out, in.data == out.data, "out == in (in-place)");
    }
    c.fp = {op_kind::broadcast, out.type, out.count, root, reduce_kind::sum, 0};
    c.rec.root_or_peer = root;
    c.rec.send_bytes = is_root ? in.bytes() : 0;
    c.rec.recv_bytes = out.bytes();
    if (out.count == 0) return finish_trivial(c);
    return run_staged(c, in, out, is_root, true, [&] {
      if (is_root && in.data != out.data) std::memcpy(out.data, in.data, out.bytes());
      if (out.count <= max_count()) {
        post(c, MPI_Ibcast(out.data, to_int(out.count), detail::move_type(out.type), root,
                           s_->comm, &c.reqs.emplace_back()),
             "MPI_Ibcast");
      } else if (is_root) {
        for (int s = 0; s < size(); ++s)
          if (s != root) p2p_send(c, out.data, out.count, out.type, s);
      } else {
        p2p_recv(c, out.data, out.count, out.type, root);
      }
      complete(c);
    });
  }

  work all_gather(buffer_view in, buffer_view out, op_options o = {}) {
    call c = begin(op_kind::all_gather, o);
    check_buffer(in, "in");
    check_buffer(out, "out");
    check_same_type(in, out);
    auto const n = static_cast<std::size_t>(size());
    WEFT_EXPECTS_SHAPE(out.count == weft::comm::detail::checked_mul(n, in.count, "size() * in.count"), "out.count",
                       weft::detail::concat("size() * in.count = ", weft::comm::detail::checked_mul(n, in.count, "size() * in.count")), out.count);
    bool const in_place = in.data == detail::at(out.data, me() * in.count, in.type);
    check_in_place_or_disjoint(in, out, in_place, "in == out + rank() * in.count (in-place)");
    c.fp = {op_kind::all_gather, in.type, in.count, -1, reduce_kind::sum, 0};
    c.rec.send_bytes = in.bytes();
    c.rec.recv_bytes = out.bytes();
    if (in.count == 0) return finish_trivial(c);
    std::vector<std::size_t> counts(n, in.count);
    return run_staged(c, in, out, true, true, [&] { gather_v(c, in, out, counts, in_place, -1); });
  }

  work all_gather_v(buffer_view in, buffer_view out, std::span<std::size_t const> counts,
                    op_options o = {}) {
    call c = begin(op_kind::all_gather_v, o);
    check_counts(counts, "counts");
    check_buffer(in, "in");
    check_buffer(out, "out");
    check_same_type(in, out);
    auto const off = weft::comm::detail::checked_offsets(counts, in.type, "counts");
    WEFT_EXPECTS_SHAPE(in.count == counts[me()], "in.count",
                       weft::detail::concat("counts[rank()] = ", counts[me()]), in.count);
    WEFT_EXPECTS_SHAPE(out.count == off.back(), "out.count",
                       weft::detail::concat("sum(counts) = ", off.back()), out.count);
    bool const in_place = in.data == detail::at(out.data, off[me()], in.type);
    check_in_place_or_disjoint(in, out, in_place,
                               "in == out + counts[0] + ... + counts[rank()-1] (in-place)");
    c.fp = {op_kind::all_gather_v, in.type, off.back(), -1, reduce_kind::sum, 0};
    c.counts.assign(counts.begin(), counts.end());
    c.rec.send_bytes = in.bytes();
    c.rec.recv_bytes = out.bytes();
    if (off.back() == 0) return finish_trivial(c);
    return run_staged(c, in, out, true, true, [&] { gather_v(c, in, out, counts, in_place, -1); });
  }

  work gather(buffer_view in, buffer_view out, int root, op_options o = {}) {
    call c = begin(op_kind::gather, o);
    check_rank(root, "root");
    check_buffer(in, "in");
    bool const is_root = root == rank();
    auto const n = static_cast<std::size_t>(size());
    bool in_place = false;
    if (is_root) {
      check_buffer(out, "out");
      check_same_type(in, out);
      WEFT_EXPECTS_SHAPE(out.count == weft::comm::detail::checked_mul(n, in.count, "size() * in.count"), "out.count (on the root)",
                         weft::detail::concat("size() * in.count = ", weft::comm::detail::checked_mul(n, in.count, "size() * in.count")), out.count);
      in_place = in.data == detail::at(out.data, me() * in.count, in.type);
      check_in_place_or_disjoint(in, out, in_place, "in == out + root * in.count (in-place)");
    }
    c.fp = {op_kind::gather, in.type, in.count, root, reduce_kind::sum, 0};
    c.rec.root_or_peer = root;
    c.rec.send_bytes = in.bytes();
    c.rec.recv_bytes = is_root ? out.bytes() : 0;
    if (in.count == 0) return finish_trivial(c);
    std::vector<std::size_t> counts(n, in.count);
    return run_staged(c, in, out, true, is_root, [&] {
      gather_v(c, in, is_root ? out : buffer_view{}, counts, in_place, root);
    });
  }

  work scatter(buffer_view in, buffer_view out, int root, op_options o = {}) {
    call c = begin(op_kind::scatter, o);
    check_rank(root, "root");
    check_buffer(out, "out");
    bool const is_root = root == rank();
    auto const n = static_cast<std::size_t>(size());
    bool in_place = false;
    if (is_root) {
      check_buffer(in, "in");
      check_same_type(in, out);
      WEFT_EXPECTS_SHAPE(in.count == weft::comm::detail::checked_mul(n, out.count, "size() * out.count"), "in.count (on the root)",
                         weft::detail::concat("size() * out.count = ", weft::comm::detail::checked_mul(n, out.count, "size() * out.count")), in.count);
      in_place = out.data == detail::at(in.data, me() * out.count, in.type);
      check_in_place_or_disjoint(in, out, in_place, "out == in + root * out.count (in-place)");
    }
    c.fp = {op_kind::scatter, out.type, out.count, root, reduce_kind::sum, 0};
    c.rec.root_or_peer = root;
    c.rec.send_bytes = is_root ? in.bytes() : 0;
    c.rec.recv_bytes = out.bytes();
    if (out.count == 0) return finish_trivial(c);
    return run_staged(c, in, out, is_root, true, [&] {
      auto const t = detail::move_type(out.type);
      auto const b = out.count;
      if (n * b <= max_count()) {
        void* recvbuf = (is_root && in_place) ? MPI_IN_PLACE : out.data;
        post(c, MPI_Iscatter(is_root ? in.data : nullptr, to_int(b), t, recvbuf, to_int(b), t, root,
                             s_->comm, &c.reqs.emplace_back()),
             "MPI_Iscatter");
      } else if (is_root) {
        for (int s = 0; s < size(); ++s) {
          auto* src = detail::at(in.data, static_cast<std::size_t>(s) * b, out.type);
          if (s != root) p2p_send(c, src, b, out.type, s);
          else if (!in_place) std::memcpy(out.data, src, out.bytes());
        }
      } else {
        p2p_recv(c, out.data, b, out.type, root);
      }
      complete(c);
    });
  }

  work all_to_all(buffer_view in, buffer_view out, op_options o = {}) {
    call c = begin(op_kind::all_to_all, o);
    check_buffer(in, "in");
    check_buffer(out, "out");
    check_same_type(in, out);
    auto const n = static_cast<std::size_t>(size());
    WEFT_EXPECTS_SHAPE(in.count % n == 0, "in.count", weft::detail::concat("a multiple of size() = ", n),
                       in.count);
    WEFT_EXPECTS_SHAPE(out.count == in.count, "out.count", in.count, out.count);
    check_in_place_or_disjoint(in, out, in.data == out.data, "out == in (in-place)");
    c.fp = {op_kind::all_to_all, in.type, in.count / n, -1, reduce_kind::sum, 0};
    c.rec.send_bytes = in.bytes();
    c.rec.recv_bytes = out.bytes();
    if (in.count == 0) return finish_trivial(c);
    std::vector<std::size_t> counts(n, in.count / n);
    return run_staged(c, in, out, true, true, [&] { all_to_all_into(c, in, out, counts, counts, true); });
  }

  work all_to_all_v(buffer_view in, buffer_view out, std::span<std::size_t const> send_counts,
                    std::span<std::size_t const> recv_counts, op_options o = {}) {
    call c = begin(op_kind::all_to_all_v, o);
    check_counts(send_counts, "send_counts");
    check_counts(recv_counts, "recv_counts");
    check_buffer(in, "in");
    check_buffer(out, "out");
    check_same_type(in, out);
    auto const so = weft::comm::detail::checked_offsets(send_counts, in.type, "send_counts");
    auto const ro = weft::comm::detail::checked_offsets(recv_counts, in.type, "recv_counts");
    WEFT_EXPECTS_SHAPE(in.count == so.back(), "in.count",
                       weft::detail::concat("sum(send_counts) = ", so.back()), in.count);
    WEFT_EXPECTS_SHAPE(out.count == ro.back(), "out.count",
                       weft::detail::concat("sum(recv_counts) = ", ro.back()), out.count);
    WEFT_EXPECTS_SHAPE(send_counts[me()] == recv_counts[me()], "send_counts[rank()]",
                       weft::detail::concat("recv_counts[rank()] = ", recv_counts[me()]),
                       send_counts[me()]);
    check_in_place_or_disjoint(in, out, in.data == out.data, "out.data == in.data (in-place)");
    c.fp = {op_kind::all_to_all_v, in.type, 0, -1, reduce_kind::sum, 0};
    c.counts.assign(send_counts.begin(), send_counts.end());
    c.counts2.assign(recv_counts.begin(), recv_counts.end());
    c.rec.send_bytes = in.bytes();
    c.rec.recv_bytes = out.bytes();
    return run_staged(c, in, out, true, true,
                      [&] { all_to_all_into(c, in, out, send_counts, recv_counts, false); });
  }

  work barrier(op_options o = {}) {
    call c = begin(op_kind::barrier, o);
    c.fp = {op_kind::barrier, dtype::u8, 0, -1, reduce_kind::sum, 0};
    return run(c, [&] {
      post(c, MPI_Ibarrier(s_->comm, &c.reqs.emplace_back()), "MPI_Ibarrier");
      complete(c);
    });
  }

  //! Collective: ranks with equal color form a communicator ordered by (key, rank); a negative
  //! color gives a non-member. Everyone's arrival is first checked against the deadline (an
  //! all-gather of the colors), then MPI_Comm_split runs; the child inherits the options.
  communicator split(int color, int key) {
    call c = begin(op_kind::split, {});
    c.fp = {op_kind::split, dtype::u8, 0, -1, reduce_kind::sum, 0};
    MPI_Comm nc = MPI_COMM_NULL;
    run(c, [&] {
      std::vector<int> mine{color, key};
      std::vector<int> all(2 * static_cast<std::size_t>(size()));
      post(c, MPI_Iallgather(mine.data(), 2, MPI_INT, all.data(), 2, MPI_INT, s_->comm,
                             &c.reqs.emplace_back()),
           "MPI_Iallgather");
      complete(c);
      int const rc = MPI_Comm_split(s_->comm, color < 0 ? MPI_UNDEFINED : color, key, &nc);
      if (rc != MPI_SUCCESS) mpi_fail(c, "MPI_Comm_split", rc);
    });
    if (nc == MPI_COMM_NULL) return communicator{};
    auto s = std::make_shared<detail::shared>();
    s->opts = s_->opts;
    s->comm = nc;
    s->owned = true;
    s->split = true;
    WEFT_MPI_TRY(MPI_Comm_set_errhandler(nc, MPI_ERRORS_RETURN));
    return communicator(std::move(s));
  }

  // ---- point to point --------------------------------------------------------------------------

  //! Blocking send: returns once `in` may be reused (MPI's standard-mode completion).
  work send(buffer_view in, int peer, op_options o = {}) {
    work w = isend(in, peer, o);
    w.wait();
    return work{};
  }
  work recv(buffer_view out, int peer, op_options o = {}) {
    work w = irecv(out, peer, o);
    w.wait();
    return work{};
  }
  //! Messages between a pair arrive in the order they were posted.
  work isend(buffer_view in, int peer, op_options o = {}) { return p2p(op_kind::send, in, peer, o); }
  work irecv(buffer_view out, int peer, op_options o = {}) { return p2p(op_kind::recv, out, peer, o); }

 private:
  using clock = detail::clock;

  struct call {
    fingerprint fp{};
    std::vector<std::size_t> counts;   // _v counts (send counts for all_to_all_v)
    std::vector<std::size_t> counts2;  // recv counts for all_to_all_v
    op_record rec{};
    std::chrono::milliseconds timeout{0};
    clock::time_point deadline{};
    std::vector<MPI_Request> reqs;
    std::vector<std::shared_ptr<void>> keep;  // staging buffers the requests use
  };

  explicit communicator(std::shared_ptr<detail::shared> s) : s_(std::move(s)) {
    WEFT_MPI_TRY(MPI_Comm_rank(s_->comm, &s_->rank));
    WEFT_MPI_TRY(MPI_Comm_size(s_->comm, &s_->size));
    if (s_->split) {
      // Local: where each rank of this group sits in MPI_COMM_WORLD, for messages.
      MPI_Group mine = MPI_GROUP_NULL;
      MPI_Group world = MPI_GROUP_NULL;
      WEFT_MPI_TRY(MPI_Comm_group(s_->comm, &mine));
      WEFT_MPI_TRY(MPI_Comm_group(MPI_COMM_WORLD, &world));
      std::vector<int> ranks(static_cast<std::size_t>(s_->size));
      for (int r = 0; r < s_->size; ++r) ranks[static_cast<std::size_t>(r)] = r;
      s_->world_ranks.assign(ranks.size(), MPI_UNDEFINED);
      int const rc = MPI_Group_translate_ranks(mine, s_->size, ranks.data(), world, s_->world_ranks.data());
      MPI_Group_free(&mine);
      MPI_Group_free(&world);
      WEFT_MPI_TRY(rc);
    }
  }

  static void check_options(options const& o) {
    WEFT_EXPECTS(o.timeout.count() > 0, "options.timeout", "> 0 ms", o.timeout.count());
    WEFT_EXPECTS(o.max_count >= 1 && o.max_count <= static_cast<std::size_t>(INT_MAX),
                 "options.max_count", "in [1, INT_MAX]", o.max_count);
  }

  [[nodiscard]] std::size_t me() const noexcept { return static_cast<std::size_t>(rank()); }
  [[nodiscard]] std::size_t max_count() const noexcept { return s_->opts.max_count; }
  static int to_int(std::size_t v) noexcept { return static_cast<int>(v); }

  [[nodiscard]] std::string context(call const& c) const {
    std::string s = weft::detail::concat(to_string(c.rec.op), " on ", s_->who(rank()), s_->label());
    if (c.rec.seq != 0) s += weft::detail::concat(" (seq ", c.rec.seq, ")");
    return s;
  }

  call begin(op_kind op, op_options const& o) {
    WEFT_EXPECTS(s_ != nullptr, "communicator", "a member communicator (size() > 0)",
                 "a non-member (default-constructed, moved-from, or split with a negative color)");
    call c;
    c.rec.op = op;
    c.rec.start = clock::now();
    c.rec.end = c.rec.start;
    WEFT_EXPECTS(o.timeout.count() >= 0, "options.timeout", ">= 0 ms (0: the communicator's default)",
                 o.timeout.count());
    c.timeout = o.timeout.count() > 0 ? o.timeout : s_->opts.timeout;
    auto const st = s_->state.load(std::memory_order_acquire);
    if (st == comm_state::aborted)
      WEFT_THROW(comm_error, context(c), " on an aborted communicator: abort() was called on this rank",
                 s_->why.message.empty() ? "" : " after: ", s_->why.message);
    if (st == comm_state::poisoned) s_->rethrow_fault(context(c) + " on a poisoned communicator");
    return c;
  }

  void check_rank(int r, char const* name) const {
    WEFT_EXPECTS(r >= 0 && r < size(), name, weft::detail::concat("a rank in [0, ", size(), ")"), r);
  }
  static void check_buffer(buffer_view const& b, char const* name) {
    WEFT_EXPECTS(weft::detail::is_valid(b.type), std::string(name) + ".type",
                 "one of f32, f64, bf16, f16, i32, i64, u8", static_cast<int>(b.type));
    WEFT_EXPECTS(b.where == memory_kind::host, std::string(name) + ".where",
                 "host memory (Debian's Open MPI is built without CUDA support)", to_string(b.where));
    WEFT_EXPECTS(b.count == 0 || b.data != nullptr, std::string(name) + ".data",
                 "non-null when count > 0", "nullptr");
    (void)weft::comm::detail::checked_bytes(b.count, b.type, std::string(name) + ".count");
  }
  static void check_same_type(buffer_view const& in, buffer_view const& out) {
    WEFT_EXPECTS(out.type == in.type, "out.type", weft::detail::concat(in.type, " (in.type)"), out.type);
  }
  static void check_in_place_or_disjoint(buffer_view const& in, buffer_view const& out,
                                         bool in_place, char const* allowed) {
    WEFT_EXPECTS(in_place || !detail::overlap(in, out), "out",
                 weft::detail::concat("disjoint from `in` or exactly ", allowed),
                 "a partial overlap with `in`");
  }
  void check_counts(std::span<std::size_t const> counts, char const* name) const {
    WEFT_EXPECTS(counts.size() == static_cast<std::size_t>(size()),
                 weft::detail::concat(name, ".size()"), weft::detail::concat(size(), " (size())"),
                 counts.size());
  }

  work finish_trivial(call& c) {
    c.rec.type = c.fp.type;
    c.rec.end = clock::now();
    s_->add(c.rec);
    s_->call_hook(c.rec, true);
    return work{};
  }

  // Runs one collective: sequence number, optional fingerprint check, the body (which posts and
  // completes its requests), the record. Faults poison the communicator and rethrow.
  template <class Body>
  work run(call& c, Body&& body) {
    std::uint64_t const seq = ++s_->seq;
    c.rec.seq = seq;
    c.rec.type = c.fp.type;
    c.fp.seq = seq;
    c.deadline = clock::now() + c.timeout;
    std::uint64_t const id = s_->add(c.rec);
    try {
      if (s_->opts.check_fingerprints) check_fingerprints(c);
      body();
    } catch (comm_error const& e) {
      c.rec.end = clock::now();
      c.rec.ok = false;
      c.rec.error = e.what();
      s_->update(id, c.rec);
      s_->call_hook(c.rec, false);
      throw;
    }
    c.rec.end = clock::now();
    s_->update(id, c.rec);
    s_->call_hook(c.rec, true);
    return work{};
  }

  // options::own_buffers: points `in` (when read) and `out` (when written) at weft's memory, held
  // by the call until it completes and buried with it when abandoned; returns what copies the
  // result back. Exact in-place forms (in and out overlap) share one staging region, so every
  // pointer relation the bodies test (in == out, in == out + offset) still holds.
  struct staged_out {
    void* user = nullptr;
    std::byte const* owned = nullptr;
    std::size_t bytes = 0;
  };
  staged_out stage(call& c, buffer_view& in, buffer_view& out, bool reads_in, bool writes_out) {
    staged_out back;
    bool const use_in = reads_in && in.count != 0;
    bool const use_out = writes_out && out.count != 0;
    auto own = [&](std::size_t bytes) {
      std::shared_ptr<std::byte[]> p(new std::byte[bytes]);
      c.keep.push_back(p);
      return p.get();
    };
    if (use_in && use_out && detail::overlap(in, out)) {
      auto const a = reinterpret_cast<std::uintptr_t>(in.data);
      auto const b = reinterpret_cast<std::uintptr_t>(out.data);
      auto const lo = std::min(a, b);
      auto const hi = std::max(a + in.bytes(), b + out.bytes());
      std::byte* const base = own(hi - lo);
      std::memcpy(base, reinterpret_cast<void const*>(lo), hi - lo);
      back = {out.data, base + (b - lo), out.bytes()};
      in.data = base + (a - lo);
      out.data = base + (b - lo);
      return back;
    }
    if (use_in) {
      std::byte* const p = own(in.bytes());
      std::memcpy(p, in.data, in.bytes());
      in.data = p;
    }
    if (use_out) {
      std::byte* const p = own(out.bytes());
      back = {out.data, p, out.bytes()};
      out.data = p;
    }
    return back;
  }

  template <class Body>
  work run_staged(call& c, buffer_view& in, buffer_view& out, bool reads_in, bool writes_out,
                  Body&& body) {
    if (!s_->opts.own_buffers) return run(c, std::forward<Body>(body));
    staged_out const back = stage(c, in, out, reads_in, writes_out);
    work w = run(c, std::forward<Body>(body));
    if (back.bytes != 0) std::memcpy(back.user, back.owned, back.bytes);
    return w;
  }

  [[noreturn]] void fail(call& c, detail::fault f) {
    if (!c.reqs.empty() || !c.keep.empty()) {
      // Requests that may never complete keep their staging buffers (and their communicator).
      for (auto& k : c.keep) s_->keep.push_back(std::move(k));
      c.keep.clear();
      if (!c.reqs.empty()) s_->abandoned = true;
    }
    s_->poison(f);
    std::string const msg = context(c) + ": " + f.message;
    switch (f.kind) {
      case errc::timeout: throw timeout_error(msg, f.missing);
      case errc::mismatch: throw mismatch_error(msg);
      case errc::backend: throw backend_error(msg, "mpi", 0);
      default: throw comm_error(msg);
    }
  }

  [[noreturn]] void mpi_fail(call& c, char const* what, int rc) {
    fail(c, {errc::backend, weft::detail::concat(what, " failed: ", detail::mpi_error_text(rc)), {}});
  }

  void post(call& c, int rc, char const* what) {
    if (rc != MPI_SUCCESS) {
      c.reqs.pop_back();
      mpi_fail(c, what, rc);
    }
  }

  // Waits for every posted request of `c` until its deadline.
  void complete(call& c) {
    if (c.reqs.empty()) return;
    detail::poll_result r{};
    try {
      r = detail::poll(*s_, c.reqs, c.deadline);
    } catch (backend_error const& e) {
      fail(c, {errc::backend, e.message(), {}});
    }
    if (r == detail::poll_result::done) {
      c.reqs.clear();
      return;
    }
    if (r == detail::poll_result::aborted) {
      for (auto& k : c.keep) s_->keep.push_back(std::move(k));
      c.keep.clear();
      s_->abandoned = true;
      WEFT_THROW(comm_error, context(c), ": the communicator was aborted while waiting");
    }
    fail(c, {errc::timeout,
             weft::detail::concat(describe(c), " timed out after ", c.timeout.count(), " ms on rank ",
                                  rank(), ": not every rank of the ", size(),
                                  " took part (MPI cannot tell which; last completed seq ",
                                  c.fp.seq - 1, ")"),
             {}});
  }

  [[nodiscard]] std::string describe(call const& c) const {
    return describe_fp(c.fp, c.counts);
  }
  static std::string describe_fp(fingerprint const& fp, std::vector<std::size_t> const& counts) {
    std::string s = weft::detail::concat(to_string(fp.op), "(dtype ", fp.type);
    switch (fp.op) {
      case op_kind::all_gather_v:
      case op_kind::reduce_scatter_v: {
        std::vector<int> v;
        for (auto x : counts) v.push_back(static_cast<int>(x));
        s += ", counts " + detail::rank_list(v);
        break;
      }
      case op_kind::all_to_all_v:
      case op_kind::barrier:
      case op_kind::split: break;
      default: s += weft::detail::concat(", count ", fp.count);
    }
    if (fp.root >= 0) s += weft::detail::concat(", root ", fp.root);
    switch (fp.op) {
      case op_kind::all_reduce:
      case op_kind::reduce:
      case op_kind::reduce_scatter:
      case op_kind::reduce_scatter_v: s += weft::detail::concat(", op ", to_string(fp.reduction)); break;
      default: break;
    }
    return weft::detail::concat(s, ", seq ", fp.seq, ")");
  }

  // Debug mode: every rank all-gathers its fingerprint (and _v counts) and compares them all, so
  // every rank reaches the same verdict and a mismatch throws everywhere before any data moves.
  void check_fingerprints(call& c) {
    auto const n = static_cast<std::size_t>(size());
    std::size_t const width = 6 + 2 * n;
    std::vector<std::int64_t> mine(width, 0);
    mine[0] = static_cast<std::int64_t>(c.fp.op);
    mine[1] = static_cast<std::int64_t>(c.fp.type);
    mine[2] = static_cast<std::int64_t>(c.fp.count);
    mine[3] = c.fp.root;
    mine[4] = static_cast<std::int64_t>(c.fp.reduction);
    mine[5] = static_cast<std::int64_t>(c.fp.seq);
    for (std::size_t i = 0; i < c.counts.size() && i < n; ++i) mine[6 + i] = static_cast<std::int64_t>(c.counts[i]);
    for (std::size_t i = 0; i < c.counts2.size() && i < n; ++i)
      mine[6 + n + i] = static_cast<std::int64_t>(c.counts2[i]);
    std::vector<std::int64_t> all(width * n);
    post(c, MPI_Iallgather(mine.data(), to_int(width), MPI_INT64_T, all.data(), to_int(width),
                           MPI_INT64_T, s_->comm, &c.reqs.emplace_back()),
         "MPI_Iallgather (fingerprints)");
    complete(c);
    auto row = [&](std::size_t r) { return all.data() + r * width; };
    auto fp_of = [&](std::size_t r, std::vector<std::size_t>& counts) {
      auto const* x = row(r);
      fingerprint f{static_cast<op_kind>(x[0]), static_cast<dtype>(x[1]), static_cast<std::size_t>(x[2]),
                    static_cast<int>(x[3]), static_cast<reduce_kind>(x[4]), static_cast<std::uint64_t>(x[5])};
      counts.clear();
      if (f.op == op_kind::all_gather_v || f.op == op_kind::reduce_scatter_v)
        for (std::size_t i = 0; i < n; ++i) counts.push_back(static_cast<std::size_t>(x[6 + i]));
      return f;
    };
    std::vector<std::size_t> c0;
    std::vector<std::size_t> cs;
    fingerprint const f0 = fp_of(0, c0);
    for (std::size_t s = 1; s < n; ++s) {
      fingerprint const fs = fp_of(s, cs);
      std::vector<std::string_view> fields;
      if (fs.op != f0.op) {
        fields.push_back("op");
      } else {
        if (fs.type != f0.type) fields.push_back("dtype");
        if (fs.count != f0.count) fields.push_back("count");
        if (fs.root != f0.root) fields.push_back("root");
        if (fs.reduction != f0.reduction &&
            (f0.op == op_kind::all_reduce || f0.op == op_kind::reduce ||
             f0.op == op_kind::reduce_scatter || f0.op == op_kind::reduce_scatter_v))
          fields.push_back("reduction");
        if (fs.seq != f0.seq) fields.push_back("sequence");
        if (cs != c0) fields.push_back("counts");
      }
      if (fields.empty()) continue;
      std::string list;
      for (auto f : fields) list += (list.empty() ? "" : ", ") + std::string(f);
      fail(c, {errc::mismatch,
               weft::detail::concat("mismatched collectives: ", s_->who(0), " called ", describe_fp(f0, c0),
                                    " but ", s_->who(static_cast<int>(s)), " called ", describe_fp(fs, cs),
                                    "; they differ in: ", list),
               {}});
    }
    if (f0.op == op_kind::all_to_all_v) {
      for (std::size_t r = 0; r < n; ++r)
        for (std::size_t s = 0; s < n; ++s)
          if (row(r)[6 + s] != row(s)[6 + n + r])
            fail(c, {errc::mismatch,
                     weft::detail::concat("mismatched all_to_all_v at seq ", f0.seq, ": ",
                                          s_->who(static_cast<int>(r)), " sends ", row(r)[6 + s],
                                          " elements to ", s_->who(static_cast<int>(s)), " but ",
                                          s_->who(static_cast<int>(s)), " expects ", row(s)[6 + n + r],
                                          " from ", s_->who(static_cast<int>(r)), "; they differ in: counts"),
                     {}});
    }
  }

  // ---- internal point-to-point (chunked fallbacks) ----------------------------------------------

  void p2p_send(call& c, void const* data, std::size_t count, dtype t, int peer) {
    auto const mt = detail::move_type(t);
    for (std::size_t done = 0; done < count; done += max_count()) {
      auto const k = std::min(max_count(), count - done);
      post(c, MPI_Isend(detail::at(data, done, t), to_int(k), mt, peer, detail::internal_tag,
                        s_->comm, &c.reqs.emplace_back()),
           "MPI_Isend");
    }
  }
  void p2p_recv(call& c, void* data, std::size_t count, dtype t, int peer) {
    auto const mt = detail::move_type(t);
    for (std::size_t done = 0; done < count; done += max_count()) {
      auto const k = std::min(max_count(), count - done);
      post(c, MPI_Irecv(detail::at(data, done, t), to_int(k), mt, peer, detail::internal_tag,
                        s_->comm, &c.reqs.emplace_back()),
           "MPI_Irecv");
    }
  }

  // Count and displacement arrays of a pending request live as long as its staging buffers.
  static int* int_array(call& c, std::span<std::size_t const> v) {
    auto a = std::make_shared<std::vector<int>>(v.size());
    for (std::size_t i = 0; i < v.size(); ++i) (*a)[i] = to_int(v[i]);
    c.keep.push_back(a);
    return a->data();
  }

  bool fits(std::span<std::size_t const> counts) const {
    std::size_t total = 0;
    for (auto x : counts)
      if (__builtin_add_overflow(total, x, &total)) return false;
    return total <= max_count();  // every count and displacement is at most the total
  }

  // all_gather(_v) (root < 0) and gather (root >= 0; `out` empty off the root).
  void gather_v(call& c, buffer_view in, buffer_view out, std::span<std::size_t const> counts,
                bool in_place, int root) {
    auto const t = detail::move_type(in.type);
    auto const off = detail::exclusive_sums(counts);
    bool const equal = std::all_of(counts.begin(), counts.end(), [&](auto x) { return x == counts[0]; });
    void const* sendbuf = in_place ? MPI_IN_PLACE : in.data;
    if (fits(counts)) {
      if (root < 0 && equal) {
        post(c, MPI_Iallgather(sendbuf, to_int(in.count), t, out.data, to_int(counts[0]), t, s_->comm,
                               &c.reqs.emplace_back()),
             "MPI_Iallgather");
      } else if (root < 0) {
        auto rc = int_array(c, counts);
        auto dis = int_array(c, std::span<std::size_t const>(off.data(), counts.size()));
        post(c, MPI_Iallgatherv(sendbuf, to_int(in.count), t, out.data, rc, dis, t, s_->comm,
                                &c.reqs.emplace_back()),
             "MPI_Iallgatherv");
      } else {
        bool const is_root = root == rank();
        post(c, MPI_Igather(is_root ? sendbuf : in.data, to_int(in.count), t,
                            is_root ? out.data : nullptr, to_int(counts[0]), t, root, s_->comm,
                            &c.reqs.emplace_back()),
             "MPI_Igather");
      }
      complete(c);
      return;
    }
    // Chunked fallback: every block travels as point-to-point messages of at most max_count.
    int const n = size();
    for (int s = 0; s < n; ++s) {
      auto const su = static_cast<std::size_t>(s);
      bool const receiver = root < 0 || root == rank();
      if (receiver && s != rank()) p2p_recv(c, detail::at(out.data, off[su], in.type), counts[su], in.type, s);
    }
    for (int d = 0; d < n; ++d) {
      if (d == rank() || (root >= 0 && d != root)) continue;
      p2p_send(c, in.data, in.count, in.type, d);
    }
    if ((root < 0 || root == rank()) && !in_place && in.count != 0)
      std::memcpy(detail::at(out.data, off[me()], in.type), in.data, in.bytes());
    complete(c);
  }

  // Equal blocks (`uniform`, the same on every rank) go through MPI_Ialltoall when they fit;
  // all_to_all_v always travels as point-to-point messages: its counts are known locally only,
  // so ranks could not agree on a native-or-chunked choice (Open MPI's own alltoallv is linear
  // point-to-point too).
  void all_to_all_into(call& c, buffer_view in, buffer_view out, std::span<std::size_t const> sc,
                       std::span<std::size_t const> rc, bool uniform) {
    std::shared_ptr<std::vector<std::byte>> copy;
    void const* src = in.data;
    if (in.data == out.data && in.count != 0) {
      // MPI's in-place all-to-all needs equal send and receive layouts; a copy serves every case.
      copy = std::make_shared<std::vector<std::byte>>(static_cast<std::byte const*>(in.data),
                                                      static_cast<std::byte const*>(in.data) + in.bytes());
      c.keep.push_back(copy);
      src = copy->data();
    }
    auto const so = detail::exclusive_sums(sc);
    auto const ro = detail::exclusive_sums(rc);
    auto const t = detail::move_type(in.type);
    if (uniform && fits(sc)) {
      post(c, MPI_Ialltoall(src, to_int(sc[0]), t, out.data, to_int(sc[0]), t, s_->comm,
                            &c.reqs.emplace_back()),
           "MPI_Ialltoall");
      complete(c);
      return;
    }
    for (int s = 0; s < size(); ++s) {
      auto const su = static_cast<std::size_t>(s);
      if (s != rank()) p2p_recv(c, detail::at(out.data, ro[su], in.type), rc[su], in.type, s);
    }
    for (int d = 0; d < size(); ++d) {
      auto const du = static_cast<std::size_t>(d);
      if (d != rank()) p2p_send(c, detail::at(src, so[du], in.type), sc[du], in.type, d);
    }
    if (sc[me()] != 0)
      std::memcpy(detail::at(out.data, ro[me()], in.type), detail::at(src, so[me()], in.type),
                  sc[me()] * size_of(in.type));
    complete(c);
  }

  // ---- reductions on the wire ------------------------------------------------------------------

  // all_reduce (root < 0) or reduce to `root`: converts to the wire type where needed, reduces in
  // chunks of at most max_count elements, converts back.
  void reduce_into(call& c, buffer_view in, buffer_view out, reduce_op op, int root) {
    dispatch(in.type, [&](auto tid) {
      using T = typename decltype(tid)::type;
      dispatch_reduce_kind(op.kind, [&](auto kind) {
        constexpr reduce_kind K = decltype(kind)::value;
        using Wr = detail::wire<T, K>;
        using W = typename Wr::type;
        bool const receives = root < 0 || root == rank();
        std::size_t const n = in.count;
        auto const* src = static_cast<T const*>(in.data);
        auto* dst = static_cast<T*>(out.data);
        W* wire_in = nullptr;
        W* wire_out = nullptr;
        bool in_place = in.data == out.data;
        if constexpr (Wr::staged_in) {
          auto buf = std::make_shared<std::vector<W>>(n);
          c.keep.push_back(buf);
          auto const scale = scale_of<T>(op);
          for (std::size_t i = 0; i < n; ++i) (*buf)[i] = reducer<T, K>::load(src[i], scale);
          wire_in = buf->data();
          if constexpr (Wr::staged_out) {
            wire_out = wire_in;  // reduce in place in the staging buffer
            in_place = true;
          } else {
            wire_out = reinterpret_cast<W*>(dst);
            in_place = false;
          }
        } else {
          wire_in = const_cast<W*>(reinterpret_cast<W const*>(src));
          wire_out = reinterpret_cast<W*>(dst);
        }
        auto const dt = Wr::datatype();
        auto const mop = Wr::op();
        for (std::size_t done = 0; done < n; done += max_count()) {
          auto const k = std::min(max_count(), n - done);
          void const* sb = in_place ? MPI_IN_PLACE : static_cast<void const*>(wire_in + done);
          if (root < 0) {
            post(c, MPI_Iallreduce(sb, wire_out + done, to_int(k), dt, mop, s_->comm,
                                   &c.reqs.emplace_back()),
                 "MPI_Iallreduce");
          } else {
            // MPI_IN_PLACE is the root's alone; elsewhere the send buffer is the data.
            void const* rsb = (receives && in_place) ? MPI_IN_PLACE : static_cast<void const*>(wire_in + done);
            post(c, MPI_Ireduce(rsb, receives ? static_cast<void*>(wire_out + done) : nullptr, to_int(k),
                                dt, mop, root, s_->comm, &c.reqs.emplace_back()),
                 "MPI_Ireduce");
          }
        }
        complete(c);
        if constexpr (Wr::finish) {
          if (receives)
            for (std::size_t i = 0; i < n; ++i) dst[i] = reducer<T, K>::finish(wire_out[i], size());
        }
      });
    });
  }

  void reduce_scatter_into(call& c, buffer_view in, buffer_view out, std::span<std::size_t const> counts,
                           reduce_op op) {
    dispatch(in.type, [&](auto tid) {
      using T = typename decltype(tid)::type;
      dispatch_reduce_kind(op.kind, [&](auto kind) {
        constexpr reduce_kind K = decltype(kind)::value;
        using Wr = detail::wire<T, K>;
        using W = typename Wr::type;
        auto const off = detail::exclusive_sums(counts);
        std::size_t const total = off.back();
        std::size_t const mine = counts[me()];
        auto const* src = static_cast<T const*>(in.data);
        auto* dst = static_cast<T*>(out.data);
        // The input goes to the wire by copy when staged or when `out` lies inside it (MPI's
        // in-place reduce-scatter puts the result at the start, weft's at the rank's offset).
        W const* wire_in = reinterpret_cast<W const*>(src);
        if (Wr::staged_in || detail::overlap(in, out)) {
          auto buf = std::make_shared<std::vector<W>>(total);
          c.keep.push_back(buf);
          if constexpr (Wr::staged_in) {
            auto const scale = scale_of<T>(op);
            for (std::size_t i = 0; i < total; ++i) (*buf)[i] = reducer<T, K>::load(src[i], scale);
          } else {
            std::memcpy(buf->data(), src, total * sizeof(T));
          }
          wire_in = buf->data();
        }
        W* wire_out = reinterpret_cast<W*>(dst);
        if constexpr (Wr::staged_out) {
          auto buf = std::make_shared<std::vector<W>>(mine);
          c.keep.push_back(buf);
          wire_out = buf->data();
        }
        auto const dt = Wr::datatype();
        auto const mop = Wr::op();
        if (fits(counts)) {
          auto* rc = int_array(c, counts);
          post(c, MPI_Ireduce_scatter(wire_in, mine == 0 ? nullptr : wire_out, rc, dt, mop,
                                      s_->comm, &c.reqs.emplace_back()),
               "MPI_Ireduce_scatter");
          complete(c);
        } else {
          // One chunked reduce per block, to the block's owner.
          for (int r = 0; r < size(); ++r) {
            auto const ru = static_cast<std::size_t>(r);
            for (std::size_t done = 0; done < counts[ru]; done += max_count()) {
              auto const k = std::min(max_count(), counts[ru] - done);
              post(c, MPI_Ireduce(wire_in + off[ru] + done, r == rank() ? wire_out + done : nullptr,
                                  to_int(k), dt, mop, r, s_->comm, &c.reqs.emplace_back()),
                   "MPI_Ireduce");
            }
          }
          complete(c);
        }
        if constexpr (Wr::finish) {
          for (std::size_t i = 0; i < mine; ++i) dst[i] = reducer<T, K>::finish(wire_out[i], size());
        }
      });
    });
  }

  // ---- user point-to-point ---------------------------------------------------------------------

  work p2p(op_kind kind, buffer_view b, int peer, op_options const& o) {
    call c = begin(kind, o);
    check_rank(peer, "peer");
    check_buffer(b, kind == op_kind::send ? "in" : "out");
    c.rec.type = b.type;
    c.rec.root_or_peer = peer;
    (kind == op_kind::send ? c.rec.send_bytes : c.rec.recv_bytes) = b.bytes();
    auto const mt = detail::move_type(b.type);
    // options::own_buffers: the message travels from (or into) weft's copy.
    std::shared_ptr<std::byte[]> owned;
    void* user_out = nullptr;
    std::size_t out_bytes = 0;
    if (s_->opts.own_buffers && b.count != 0) {
      owned.reset(new std::byte[b.bytes()]);
      c.keep.push_back(owned);
      if (kind == op_kind::send) {
        std::memcpy(owned.get(), b.data, b.bytes());
      } else {
        user_out = b.data;
        out_bytes = b.bytes();
      }
      b.data = owned.get();
    }
    // A zero-length message still travels (it pairs with the peer's call).
    std::size_t done = 0;
    do {
      auto const k = std::min(max_count(), b.count - done);
      void* p = b.count == 0 ? nullptr : detail::at(b.data, done, b.type);
      int const rc = kind == op_kind::send
                         ? MPI_Isend(p, to_int(k), mt, peer, detail::user_tag, s_->comm, &c.reqs.emplace_back())
                         : MPI_Irecv(p, to_int(k), mt, peer, detail::user_tag, s_->comm, &c.reqs.emplace_back());
      post(c, rc, kind == op_kind::send ? "MPI_Isend" : "MPI_Irecv");
      done += k;
    } while (done < b.count);
    auto const id = s_->add(c.rec);
    return work(std::make_shared<detail::p2p_work>(s_, std::move(c.reqs), id, c.rec,
                                                   clock::now() + c.timeout, c.timeout,
                                                   std::move(owned), user_out, out_bytes));
  }

  std::shared_ptr<detail::shared> s_;
};

static_assert(Communicator<communicator>);

}  // namespace weft::comm::mpi
