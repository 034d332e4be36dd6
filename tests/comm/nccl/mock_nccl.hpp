// tests/comm/nccl/mock_nccl.hpp — a mock of the NCCL and CUDA runtime calls behind weft's nccl_api:
// a world of ranks (threads of this process) on host memory that records every call, executes
// collectives once every rank has posted, orders work per (thread, stream), answers ncclInProgress
// for a few polls, and injects errors. Buffers marked memory_kind::cuda are plain host vectors
// here.
#pragma once

#include <weft/comm/nccl/api.hpp>
#include <weft/core/dtype.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

namespace weft::test::nccl_mock {

//! One recorded call.
struct call {
  std::string name;
  int rank = -1;  // rank in the communicator called (-1: none)
  void const* send = nullptr;
  void* recv = nullptr;
  std::size_t count = 0;
  int type = -1;  // ncclDataType_t
  int op = -1;    // ncclRedOp_t
  int root_or_peer = -1;
  void* stream = nullptr;
  int blocking = -1;    // ncclConfig_t::blocking for init and split
  double scalar = 0.0;  // premul scalar as read by the mock
};

struct group_state;

struct premul_info {
  double scalar = 0.0;
  ncclDataType_t type = ncclFloat32;
  bool alive = true;
  int uses = 0;
};

struct comm_obj {
  std::shared_ptr<group_state> g;  // null until the split rendezvous completes
  int rank = -1;
  int device = 0;
  std::uint64_t next_seq = 0;
  std::uint64_t split_seq = 0;
  int polls_left = 0;
  ncclResult_t async = ncclSuccess;
  bool aborted = false;
  bool destroyed = false;
  bool finalized = false;
  std::map<int, premul_info> ops;
  int next_op = static_cast<int>(ncclNumOps);
};

//! A posted collective or point-to-point operation.
struct post {
  std::string kind;
  comm_obj* c = nullptr;
  int rank = -1;
  void const* send = nullptr;
  void* recv = nullptr;
  std::size_t count = 0;
  ncclDataType_t type = ncclFloat32;
  int op = -1;
  bool premul = false;
  double scalar = 1.0;
  int root = -1;  // root, or peer for send/recv
  void* stream = nullptr;
  std::shared_ptr<bool> done = std::make_shared<bool>(false);
};

struct split_post {
  comm_obj* parent = nullptr;
  comm_obj* child = nullptr;
  int color = 0;
  int key = 0;
};

struct group_state {
  int size = 0;
  int joined = 0;
  std::map<std::uint64_t, std::vector<post>> pending;            // collectives by seq
  std::map<std::pair<int, int>, std::deque<post>> sends, recvs;  // (src, dst)
  std::map<std::uint64_t, std::vector<split_post>> splits;
};

//! Work in a stream, in order: an operation (done when executed), a copy (run when reached) or an
//! event marker (reached when everything before it is done).
struct stream_item {
  std::shared_ptr<bool> done;  // operation
  std::function<void()> copy;  // memcpy_async
  std::shared_ptr<bool> marker;
};
struct stream_q {
  std::deque<stream_item> items;
};
struct mock_event {
  std::shared_ptr<stream_q> q;
  std::shared_ptr<bool> reached;
  int not_ready_polls = 0;
  bool destroyed = false;
};

inline double load(ncclDataType_t t, void const* p, std::size_t i) {
  auto const* b = static_cast<unsigned char const*>(p);
  auto get = [&](auto v) {
    std::memcpy(&v, b + i * sizeof(v), sizeof(v));
    return v;
  };
  switch (t) {
    case ncclFloat32: return get(float{});
    case ncclFloat64: return get(double{});
    case ncclBfloat16: return static_cast<float>(get(weft::bf16{}));
    case ncclFloat16: return static_cast<float>(get(weft::f16{}));
    case ncclInt32: return get(std::int32_t{});
    case ncclInt64: return static_cast<double>(get(std::int64_t{}));
    case ncclUint8: return get(std::uint8_t{});
    default: return 0.0;
  }
}

inline void store(ncclDataType_t t, void* p, std::size_t i, double v) {
  auto* b = static_cast<unsigned char*>(p);
  auto put = [&](auto x) { std::memcpy(b + i * sizeof(x), &x, sizeof(x)); };
  switch (t) {
    case ncclFloat32: put(static_cast<float>(v)); break;
    case ncclFloat64: put(v); break;
    case ncclBfloat16: put(weft::bf16(static_cast<float>(v))); break;
    case ncclFloat16: put(weft::f16(static_cast<float>(v))); break;
    case ncclInt32: put(static_cast<std::int32_t>(v)); break;
    case ncclInt64: put(static_cast<std::int64_t>(v)); break;
    case ncclUint8: put(static_cast<std::uint8_t>(v)); break;
    default: break;
  }
}

inline std::size_t type_size(ncclDataType_t t) {
  switch (t) {
    case ncclFloat64:
    case ncclInt64: return 8;
    case ncclFloat32:
    case ncclInt32: return 4;
    case ncclBfloat16:
    case ncclFloat16: return 2;
    default: return 1;
  }
}

inline bool is_int(ncclDataType_t t) { return t == ncclInt32 || t == ncclInt64 || t == ncclUint8; }

//! An integer element, exactly (load() goes through double).
inline std::int64_t load_int(ncclDataType_t t, void const* p, std::size_t i) {
  auto const* b = static_cast<unsigned char const*>(p);
  auto get = [&](auto v) {
    std::memcpy(&v, b + i * sizeof(v), sizeof(v));
    return static_cast<std::int64_t>(v);
  };
  switch (t) {
    case ncclInt32: return get(std::int32_t{});
    case ncclInt64: return get(std::int64_t{});
    case ncclUint8: return get(std::uint8_t{});
    default: return 0;
  }
}

//! `v` modulo 2^bits of the integer type, as that type's value (two's complement, as NCCL and
//! weft's reference wrap integer sums and products).
inline std::int64_t wrap_int(ncclDataType_t t, std::uint64_t v) {
  switch (t) {
    case ncclInt32: return static_cast<std::int32_t>(static_cast<std::uint32_t>(v));
    case ncclUint8: return static_cast<std::uint8_t>(v);
    default: return static_cast<std::int64_t>(v);
  }
}

inline void store_int(ncclDataType_t t, void* p, std::size_t i, std::int64_t v) {
  auto* b = static_cast<unsigned char*>(p);
  auto put = [&](auto x) { std::memcpy(b + i * sizeof(x), &x, sizeof(x)); };
  switch (t) {
    case ncclInt32: put(static_cast<std::int32_t>(v)); break;
    case ncclInt64: put(v); break;
    case ncclUint8: put(static_cast<std::uint8_t>(v)); break;
    default: break;
  }
}

//! The mock world. One instance per test (construct it, pass api() to the communicators).
class mock {
 public:
  // --- knobs ---
  int in_progress_polls = 2;         // ncclInProgress answers of GetAsyncError after InProgress
  int event_not_ready_polls = 2;     // cudaErrorNotReady answers before a reached event succeeds
  bool enqueue_in_progress = false;  // collectives and group ends answer ncclInProgress
  bool unique_id_fails = false;

  mock() { current() = this; }
  ~mock() {
    for (auto* p : allocations_) std::free(p);
    current() = nullptr;
  }
  mock(mock const&) = delete;
  mock& operator=(mock const&) = delete;

  static weft::comm::nccl::nccl_api const& api() {
    static weft::comm::nccl::nccl_api const table{
        .get_version = &get_version,
        .get_unique_id = &get_unique_id,
        .comm_init_rank_config = &init_rank_config,
        .comm_split = &comm_split,
        .comm_finalize = &comm_finalize,
        .comm_destroy = &comm_destroy,
        .comm_abort = &comm_abort,
        .comm_get_async_error = &get_async_error,
        .comm_count = &comm_count,
        .comm_user_rank = &comm_user_rank,
        .comm_cu_device = &comm_cu_device,
        .get_error_string = &get_error_string,
        .get_last_error = &get_last_error,
        .red_op_create_pre_mul_sum = &premul_create,
        .red_op_destroy = &premul_destroy,
        .all_reduce = &all_reduce,
        .broadcast = &broadcast,
        .reduce = &reduce,
        .all_gather = &all_gather,
        .reduce_scatter = &reduce_scatter,
        .all_to_all = &all_to_all,
        .gather = &gather,
        .scatter = &scatter,
        .send = &send,
        .recv = &recv,
        .group_start = &group_start,
        .group_end = &group_end,
        .event_create_with_flags = &event_create,
        .event_record = &event_record,
        .event_query = &event_query,
        .event_destroy = &event_destroy,
        .stream_wait_event = &stream_wait_event,
        .get_device = &get_device,
        .set_device = &set_device,
        .malloc = &dev_malloc,
        .free = &dev_free,
        .memcpy_async = &memcpy_async,
        .cuda_error_name = &cuda_error_name,
    };
    return table;
  }

  // --- error injection ---
  //! The next `times` calls named `name` (e.g. "ncclAllReduce") on `rank` (-1: any) return `r`.
  void fail_next(std::string name, ncclResult_t r, int rank = -1, int times = 1) {
    std::lock_guard lock(m_);
    for (int i = 0; i < times; ++i) failures_.push_back({std::move(name), rank, r});
  }
  //! ncclCommGetAsyncError of `comm` reports `r` from now on.
  void set_async_error(ncclComm_t comm, ncclResult_t r) {
    std::lock_guard lock(m_);
    as_obj(comm)->async = r;
  }
  //! cudaEventQuery answers `e` for every event recorded from now on.
  void set_event_error(cudaError_t e) {
    std::lock_guard lock(m_);
    event_error_ = e;
  }

  // --- inspection ---
  std::vector<call> calls() const {
    std::lock_guard lock(m_);
    return calls_;
  }
  std::vector<call> calls_named(std::string const& name, int rank = -2) const {
    std::lock_guard lock(m_);
    std::vector<call> out;
    for (auto const& c : calls_)
      if (c.name == name && (rank == -2 || c.rank == rank)) out.push_back(c);
    return out;
  }
  std::size_t count(std::string const& name, int rank = -2) const {
    return calls_named(name, rank).size();
  }
  //! Things the mock found wrong (mismatched posts, premul misuse, leaks); tests expect none.
  std::vector<std::string> problems() const {
    std::lock_guard lock(m_);
    return problems_;
  }
  int live_premul_ops() const {
    std::lock_guard lock(m_);
    int n = 0;
    for (auto const& c : comms_)
      for (auto const& [id, op] : c->ops) n += op.alive ? 1 : 0;
    return n;
  }
  int live_events() const {
    std::lock_guard lock(m_);
    int n = 0;
    for (auto const& e : events_) n += e->destroyed ? 0 : 1;
    return n;
  }
  bool aborted(ncclComm_t c) const {
    std::lock_guard lock(m_);
    return as_obj(c)->aborted;
  }
  bool destroyed(ncclComm_t c) const {
    std::lock_guard lock(m_);
    return as_obj(c)->destroyed;
  }
  //! A fresh unique id as ncclGetUniqueId would make it (for init() and adopt tests).
  ncclUniqueId make_id() {
    ncclUniqueId id{};
    (void)get_unique_id(&id);
    return id;
  }

 private:
  struct failure {
    std::string name;
    int rank;
    ncclResult_t r;
  };

  static mock*& current() {
    static mock* m = nullptr;
    return m;
  }
  static mock& self() { return *current(); }
  static comm_obj* as_obj(ncclComm_t c) { return reinterpret_cast<comm_obj*>(c); }
  static ncclComm_t as_comm(comm_obj* c) { return reinterpret_cast<ncclComm_t>(c); }
  static mock_event* as_ev(cudaEvent_t e) { return reinterpret_cast<mock_event*>(e); }

  struct thread_state {
    int group_depth = 0;
    std::vector<post> grouped;
    int device = 0;
  };
  static thread_state& ts() {
    thread_local thread_state s;
    return s;
  }

  // Callers hold m_.
  bool injected(std::string const& name, int rank, ncclResult_t& r) {
    for (auto it = failures_.begin(); it != failures_.end(); ++it) {
      if (it->name == name && (it->rank == -1 || it->rank == rank)) {
        r = it->r;
        failures_.erase(it);
        return true;
      }
    }
    return false;
  }
  std::shared_ptr<stream_q> queue(void* stream) {
    auto& q = streams_[{std::this_thread::get_id(), stream}];
    if (!q) q = std::make_shared<stream_q>();
    return q;
  }
  static void progress(stream_q& q) {
    while (!q.items.empty()) {
      auto& f = q.items.front();
      if (f.done) {
        if (!*f.done) return;
      } else if (f.copy) {
        f.copy();
      } else if (f.marker) {
        *f.marker = true;
      }
      q.items.pop_front();
    }
  }

  // --- lifecycle ---
  static ncclResult_t get_version(int* v) {
    *v = NCCL_VERSION_CODE;
    return ncclSuccess;
  }
  static ncclResult_t get_unique_id(ncclUniqueId* id) {
    auto& M = self();
    std::lock_guard lock(M.m_);
    M.calls_.push_back({.name = "ncclGetUniqueId"});
    if (M.unique_id_fails) return ncclSystemError;
    *id = ncclUniqueId{};
    std::uint64_t const key = ++M.next_key_;
    std::memcpy(id->internal, &key, sizeof(key));
    return ncclSuccess;
  }
  static ncclResult_t init_rank_config(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank,
                                       ncclConfig_t* config) {
    auto& M = self();
    std::lock_guard lock(M.m_);
    M.calls_.push_back({.name = "ncclCommInitRankConfig",
                        .rank = rank,
                        .count = std::size_t(nranks),
                        .blocking = config ? config->blocking : -1});
    ncclResult_t r{};
    if (M.injected("ncclCommInitRankConfig", rank, r)) return r;
    std::uint64_t key = 0;
    std::memcpy(&key, id.internal, sizeof(key));
    auto& g = M.groups_[key];
    if (!g) {
      g = std::make_shared<group_state>();
      g->size = nranks;
    }
    if (g->size != nranks) M.problems_.push_back("init: nranks differ across ranks");
    auto obj = std::make_unique<comm_obj>();
    obj->g = g;
    obj->rank = rank;
    obj->device = ts().device;
    obj->polls_left = M.in_progress_polls;
    ++g->joined;
    *comm = as_comm(obj.get());
    M.comms_.push_back(std::move(obj));
    if (config == nullptr || config->blocking != 0) {
      M.problems_.push_back("init: blocking communicator requested");
      return ncclSuccess;
    }
    return ncclInProgress;
  }
  static ncclResult_t comm_split(ncclComm_t comm, int color, int key, ncclComm_t* newcomm,
                                 ncclConfig_t* config) {
    auto& M = self();
    std::lock_guard lock(M.m_);
    auto* p = as_obj(comm);
    M.calls_.push_back({.name = "ncclCommSplit",
                        .rank = p->rank,
                        .op = color,
                        .root_or_peer = key,
                        .blocking = config ? config->blocking : -1});
    ncclResult_t r{};
    if (M.injected("ncclCommSplit", p->rank, r)) return r;
    comm_obj* child = nullptr;
    if (color != NCCL_SPLIT_NOCOLOR) {
      auto obj = std::make_unique<comm_obj>();
      obj->device = p->device;
      obj->polls_left = M.in_progress_polls;
      child = obj.get();
      M.comms_.push_back(std::move(obj));
    }
    *newcomm = child ? as_comm(child) : nullptr;
    p->polls_left = M.in_progress_polls;
    auto& posts = p->g->splits[p->split_seq++];
    posts.push_back({p, child, color, key});
    if (static_cast<int>(posts.size()) == p->g->size) {
      std::map<int, std::vector<split_post>> by_color;
      for (auto const& s : posts)
        if (s.color != NCCL_SPLIT_NOCOLOR) by_color[s.color].push_back(s);
      for (auto& [c, v] : by_color) {
        std::sort(v.begin(), v.end(), [](split_post const& a, split_post const& b) {
          return std::tie(a.key, a.parent->rank) < std::tie(b.key, b.parent->rank);
        });
        auto g = std::make_shared<group_state>();
        g->size = static_cast<int>(v.size());
        g->joined = g->size;
        for (std::size_t i = 0; i < v.size(); ++i) {
          v[i].child->g = g;
          v[i].child->rank = static_cast<int>(i);
        }
      }
    }
    return (config != nullptr && config->blocking == 0) ? ncclInProgress : ncclSuccess;
  }
  static ncclResult_t comm_finalize(ncclComm_t comm) {
    auto& M = self();
    std::lock_guard lock(M.m_);
    M.calls_.push_back({.name = "ncclCommFinalize", .rank = as_obj(comm)->rank});
    as_obj(comm)->finalized = true;
    as_obj(comm)->polls_left = M.in_progress_polls;
    return ncclInProgress;
  }
  static ncclResult_t comm_destroy(ncclComm_t comm) {
    auto& M = self();
    std::lock_guard lock(M.m_);
    auto* c = as_obj(comm);
    M.calls_.push_back({.name = "ncclCommDestroy", .rank = c->rank});
    if (c->destroyed || c->aborted) M.problems_.push_back("destroy after destroy/abort");
    c->destroyed = true;
    return ncclSuccess;
  }
  static ncclResult_t comm_abort(ncclComm_t comm) {
    auto& M = self();
    std::lock_guard lock(M.m_);
    auto* c = as_obj(comm);
    M.calls_.push_back({.name = "ncclCommAbort", .rank = c->rank});
    if (c->destroyed || c->aborted) M.problems_.push_back("abort after destroy/abort");
    c->aborted = true;
    return ncclSuccess;
  }
  static ncclResult_t get_async_error(ncclComm_t comm, ncclResult_t* out) {
    auto& M = self();
    std::lock_guard lock(M.m_);
    auto* c = as_obj(comm);
    ncclResult_t r{};
    if (M.injected("ncclCommGetAsyncError", c->rank, r)) return r;
    if (c->async != ncclSuccess) {
      *out = c->async;
    } else if (!c->g || c->g->joined < c->g->size) {
      *out = ncclInProgress;
    } else if (c->polls_left > 0) {
      --c->polls_left;
      *out = ncclInProgress;
    } else {
      *out = ncclSuccess;
    }
    return ncclSuccess;
  }
  static ncclResult_t comm_count(ncclComm_t comm, int* n) {
    auto& M = self();
    std::lock_guard lock(M.m_);
    auto* c = as_obj(comm);
    if (!c->g) return ncclInvalidUsage;
    *n = c->g->size;
    return ncclSuccess;
  }
  static ncclResult_t comm_user_rank(ncclComm_t comm, int* r) {
    auto& M = self();
    std::lock_guard lock(M.m_);
    auto* c = as_obj(comm);
    if (!c->g) return ncclInvalidUsage;
    *r = c->rank;
    return ncclSuccess;
  }
  static ncclResult_t comm_cu_device(ncclComm_t comm, int* d) {
    auto& M = self();
    std::lock_guard lock(M.m_);
    *d = as_obj(comm)->device;
    return ncclSuccess;
  }
  static char const* get_error_string(ncclResult_t r) {
    switch (r) {
      case ncclSuccess: return "no error";
      case ncclUnhandledCudaError: return "unhandled cuda error (mock)";
      case ncclSystemError: return "unhandled system error (mock)";
      case ncclInternalError: return "internal error (mock)";
      case ncclInvalidArgument: return "invalid argument (mock)";
      case ncclInvalidUsage: return "invalid usage (mock)";
      case ncclRemoteError: return "remote process exited or there was a network error (mock)";
      case ncclInProgress: return "NCCL operation in progress (mock)";
      default: return "unknown result code (mock)";
    }
  }
  static char const* get_last_error(ncclComm_t) { return "mock last error"; }

  // --- reduction ops ---
  static ncclResult_t premul_create(ncclRedOp_t* op, void* scalar, ncclDataType_t t,
                                    ncclScalarResidence_t residence, ncclComm_t comm) {
    auto& M = self();
    std::lock_guard lock(M.m_);
    auto* c = as_obj(comm);
    double const s = load(t, scalar, 0);
    M.calls_.push_back(
        {.name = "ncclRedOpCreatePreMulSum", .rank = c->rank, .type = t, .scalar = s});
    ncclResult_t r{};
    if (M.injected("ncclRedOpCreatePreMulSum", c->rank, r)) return r;
    if (residence != ncclScalarHostImmediate)
      M.problems_.push_back("premul: scalar not host-immediate");
    int const id = c->next_op++;
    c->ops[id] = {s, t, true, 0};
    *op = static_cast<ncclRedOp_t>(id);
    return ncclSuccess;
  }
  static ncclResult_t premul_destroy(ncclRedOp_t op, ncclComm_t comm) {
    auto& M = self();
    std::lock_guard lock(M.m_);
    auto* c = as_obj(comm);
    M.calls_.push_back({.name = "ncclRedOpDestroy", .rank = c->rank, .op = static_cast<int>(op)});
    auto it = c->ops.find(static_cast<int>(op));
    if (it == c->ops.end() || !it->second.alive) {
      M.problems_.push_back("premul: destroy of an unknown or destroyed op");
      return ncclInvalidArgument;
    }
    if (it->second.uses == 0) M.problems_.push_back("premul: op destroyed before any use");
    it->second.alive = false;
    return ncclSuccess;
  }

  // --- operations ---
  ncclResult_t enqueue(post p, std::string const& name) {
    calls_.push_back({.name = name,
                      .rank = p.rank,
                      .send = p.send,
                      .recv = p.recv,
                      .count = p.count,
                      .type = static_cast<int>(p.type),
                      .op = p.op,
                      .root_or_peer = p.root,
                      .stream = p.stream});
    ncclResult_t r{};
    if (injected(name, p.rank, r)) return r;
    if (p.c->aborted || p.c->destroyed) {
      problems_.push_back(name + " on an aborted or destroyed communicator");
      return ncclInvalidUsage;
    }
    if (p.op >= static_cast<int>(ncclNumOps)) {
      auto it = p.c->ops.find(p.op);
      if (it == p.c->ops.end() || !it->second.alive) {
        problems_.push_back(name + ": premul op unknown or destroyed");
        return ncclInvalidArgument;
      }
      if (it->second.type != p.type)
        problems_.push_back(name + ": premul op created for another dtype");
      ++it->second.uses;
      p.premul = true;
      p.scalar = it->second.scalar;
    }
    queue(p.stream)->items.push_back({p.done, {}, {}});
    if (ts().group_depth > 0) {
      ts().grouped.push_back(std::move(p));
      return ncclSuccess;
    }
    comm_obj* const c = p.c;
    submit(std::move(p));
    if (enqueue_in_progress) return in_progress(c);
    return ncclSuccess;
  }
  ncclResult_t in_progress(comm_obj* c) {
    if (c != nullptr) c->polls_left = in_progress_polls;
    return ncclInProgress;
  }

  void submit(post p) {
    auto& g = *p.c->g;
    if (p.kind == "send" || p.kind == "recv") {
      auto const key =
          p.kind == "send" ? std::make_pair(p.rank, p.root) : std::make_pair(p.root, p.rank);
      (p.kind == "send" ? g.sends : g.recvs)[key].push_back(std::move(p));
      auto& s = g.sends[key];
      auto& r = g.recvs[key];
      while (!s.empty() && !r.empty()) {
        if (s.front().count != r.front().count || s.front().type != r.front().type) {
          problems_.push_back("send/recv count or dtype mismatch");
          return;
        }
        std::memcpy(r.front().recv, s.front().send, s.front().count * type_size(s.front().type));
        *s.front().done = true;
        *r.front().done = true;
        s.pop_front();
        r.pop_front();
      }
      return;
    }
    auto const seq = p.c->next_seq++;
    auto& v = g.pending[seq];
    v.push_back(std::move(p));
    if (static_cast<int>(v.size()) < g.size) return;
    std::sort(v.begin(), v.end(), [](post const& a, post const& b) { return a.rank < b.rank; });
    for (auto const& q : v) {
      if (q.kind != v[0].kind || q.count != v[0].count || q.type != v[0].type ||
          q.root != v[0].root || q.premul != v[0].premul || (!q.premul && q.op != v[0].op)) {
        problems_.push_back("collective mismatch at seq " + std::to_string(seq) + ": " + v[0].kind +
                            " vs " + q.kind);
        return;  // like NCCL: never completes
      }
    }
    execute(v);
    for (auto& q : v) *q.done = true;
    g.pending.erase(seq);
  }

  //! Integer reductions in the element type, wrapping like NCCL: sums and products modulo
  //! 2^bits (premul scalars are integers), avg the wrapped sum divided by n truncating.
  static std::int64_t reduce_int_at(std::vector<post> const& v, std::size_t offset, std::size_t i) {
    auto const t = v[0].type;
    int const op = v[0].op;
    auto x = [&](post const& q) {
      auto const s =
          q.premul ? static_cast<std::uint64_t>(static_cast<std::int64_t>(q.scalar)) : 1u;
      return wrap_int(t, static_cast<std::uint64_t>(load_int(t, q.send, offset + i)) * s);
    };
    std::int64_t acc = x(v[0]);
    for (std::size_t r = 1; r < v.size(); ++r) {
      std::int64_t const y = x(v[r]);
      if (v[0].premul || op == ncclSum || op == ncclAvg) {
        acc = wrap_int(t, static_cast<std::uint64_t>(acc) + static_cast<std::uint64_t>(y));
      } else if (op == ncclProd) {
        acc = wrap_int(t, static_cast<std::uint64_t>(acc) * static_cast<std::uint64_t>(y));
      } else if (op == ncclMin) {
        acc = std::min(acc, y);
      } else if (op == ncclMax) {
        acc = std::max(acc, y);
      }
    }
    if (!v[0].premul && op == ncclAvg) acc /= static_cast<std::int64_t>(v.size());
    return acc;
  }

  //! Element i of the reduction of the posts' inputs from `offset`, stored into `o`.
  static void store_reduced(std::vector<post> const& v, void* o, std::size_t offset,
                            std::size_t i) {
    if (is_int(v[0].type)) {
      store_int(v[0].type, o, i, reduce_int_at(v, offset, i));
    } else {
      store(v[0].type, o, i, reduce_at(v, offset, i));
    }
  }

  static double reduce_at(std::vector<post> const& v, std::size_t offset, std::size_t i) {
    auto const t = v[0].type;
    int const op = v[0].op;
    auto x = [&](post const& q) {
      return load(t, q.send, offset + i) * (q.premul ? q.scalar : 1.0);
    };
    double acc = x(v[0]);
    for (std::size_t r = 1; r < v.size(); ++r) {
      double const y = x(v[r]);
      if (v[0].premul || op == ncclSum || op == ncclAvg)
        acc += y;
      else if (op == ncclProd)
        acc *= y;
      else if (op == ncclMin)
        acc = std::min(acc, y);
      else if (op == ncclMax)
        acc = std::max(acc, y);
    }
    if (!v[0].premul && op == ncclAvg) {
      acc /= static_cast<double>(v.size());
      if (is_int(t)) acc = std::trunc(acc);
    }
    return acc;
  }

  static void execute(std::vector<post> const& v) {
    auto const& k = v[0].kind;
    auto const t = v[0].type;
    std::size_t const n = v[0].count;
    std::size_t const es = type_size(t);
    std::size_t const size = v.size();
    int const root = v[0].root;
    // Results are computed into temporaries first so in-place forms read their inputs intact.
    std::vector<std::vector<unsigned char>> out(size);
    auto result = [&](std::size_t r, std::size_t elems) -> void* {
      out[r].assign(elems * es, 0);
      return out[r].data();
    };
    std::vector<std::size_t> lens(size, 0);
    for (std::size_t r = 0; r < size; ++r) {
      if (k == "all_reduce") {
        void* o = result(r, n);
        for (std::size_t i = 0; i < n; ++i) store_reduced(v, o, 0, i);
        lens[r] = n;
      } else if (k == "reduce" && static_cast<int>(r) == root) {
        void* o = result(r, n);
        for (std::size_t i = 0; i < n; ++i) store_reduced(v, o, 0, i);
        lens[r] = n;
      } else if (k == "broadcast") {
        void* o = result(r, n);
        std::memcpy(o, v[root].send, n * es);
        lens[r] = n;
      } else if (k == "all_gather" || (k == "gather" && static_cast<int>(r) == root)) {
        auto* o = static_cast<unsigned char*>(result(r, n * size));
        for (std::size_t q = 0; q < size; ++q) std::memcpy(o + q * n * es, v[q].send, n * es);
        lens[r] = n * size;
      } else if (k == "reduce_scatter") {
        void* o = result(r, n);
        for (std::size_t i = 0; i < n; ++i) store_reduced(v, o, r * n, i);
        lens[r] = n;
      } else if (k == "all_to_all") {
        auto* o = static_cast<unsigned char*>(result(r, n * size));
        for (std::size_t q = 0; q < size; ++q)
          std::memcpy(o + q * n * es, static_cast<unsigned char const*>(v[q].send) + r * n * es,
                      n * es);
        lens[r] = n * size;
      } else if (k == "scatter") {
        void* o = result(r, n);
        std::memcpy(o, static_cast<unsigned char const*>(v[root].send) + r * n * es, n * es);
        lens[r] = n;
      }
    }
    for (std::size_t r = 0; r < size; ++r)
      if (lens[r] > 0) std::memcpy(v[r].recv, out[r].data(), lens[r] * es);
  }

  static ncclResult_t op_call(std::string kind, std::string name, void const* s, void* r,
                              std::size_t count, ncclDataType_t t, int op, int root,
                              ncclComm_t comm, cudaStream_t st) {
    auto& M = self();
    std::lock_guard lock(M.m_);
    post p;
    p.kind = std::move(kind);
    p.c = as_obj(comm);
    p.rank = p.c->rank;
    p.send = s;
    p.recv = r;
    p.count = count;
    p.type = t;
    p.op = op;
    p.root = root;
    p.stream = st;
    return M.enqueue(std::move(p), name);
  }
  static ncclResult_t all_reduce(void const* s, void* r, std::size_t n, ncclDataType_t t,
                                 ncclRedOp_t op, ncclComm_t c, cudaStream_t st) {
    return op_call("all_reduce", "ncclAllReduce", s, r, n, t, op, -1, c, st);
  }
  static ncclResult_t broadcast(void const* s, void* r, std::size_t n, ncclDataType_t t, int root,
                                ncclComm_t c, cudaStream_t st) {
    return op_call("broadcast", "ncclBroadcast", s, r, n, t, -1, root, c, st);
  }
  static ncclResult_t reduce(void const* s, void* r, std::size_t n, ncclDataType_t t,
                             ncclRedOp_t op, int root, ncclComm_t c, cudaStream_t st) {
    return op_call("reduce", "ncclReduce", s, r, n, t, op, root, c, st);
  }
  static ncclResult_t all_gather(void const* s, void* r, std::size_t n, ncclDataType_t t,
                                 ncclComm_t c, cudaStream_t st) {
    return op_call("all_gather", "ncclAllGather", s, r, n, t, -1, -1, c, st);
  }
  static ncclResult_t reduce_scatter(void const* s, void* r, std::size_t n, ncclDataType_t t,
                                     ncclRedOp_t op, ncclComm_t c, cudaStream_t st) {
    return op_call("reduce_scatter", "ncclReduceScatter", s, r, n, t, op, -1, c, st);
  }
  static ncclResult_t all_to_all(void const* s, void* r, std::size_t n, ncclDataType_t t,
                                 ncclComm_t c, cudaStream_t st) {
    return op_call("all_to_all", "ncclAlltoAll", s, r, n, t, -1, -1, c, st);
  }
  static ncclResult_t gather(void const* s, void* r, std::size_t n, ncclDataType_t t, int root,
                             ncclComm_t c, cudaStream_t st) {
    return op_call("gather", "ncclGather", s, r, n, t, -1, root, c, st);
  }
  static ncclResult_t scatter(void const* s, void* r, std::size_t n, ncclDataType_t t, int root,
                              ncclComm_t c, cudaStream_t st) {
    return op_call("scatter", "ncclScatter", s, r, n, t, -1, root, c, st);
  }
  static ncclResult_t send(void const* s, std::size_t n, ncclDataType_t t, int peer, ncclComm_t c,
                           cudaStream_t st) {
    return op_call("send", "ncclSend", s, nullptr, n, t, -1, peer, c, st);
  }
  static ncclResult_t recv(void* r, std::size_t n, ncclDataType_t t, int peer, ncclComm_t c,
                           cudaStream_t st) {
    return op_call("recv", "ncclRecv", nullptr, r, n, t, -1, peer, c, st);
  }
  static ncclResult_t group_start() {
    auto& M = self();
    std::lock_guard lock(M.m_);
    M.calls_.push_back({.name = "ncclGroupStart"});
    ++ts().group_depth;
    return ncclSuccess;
  }
  static ncclResult_t group_end() {
    auto& M = self();
    std::lock_guard lock(M.m_);
    M.calls_.push_back({.name = "ncclGroupEnd"});
    auto& s = ts();
    if (s.group_depth == 0) {
      M.problems_.push_back("ncclGroupEnd without ncclGroupStart");
      return ncclInvalidUsage;
    }
    ncclResult_t r{};
    bool const fail = M.injected("ncclGroupEnd", -1, r);
    if (--s.group_depth > 0) return fail ? r : ncclSuccess;
    auto posts = std::move(s.grouped);
    s.grouped.clear();
    comm_obj* last = posts.empty() ? nullptr : posts.back().c;
    if (fail) {
      for (auto& p : posts) *p.done = true;  // discarded, so nothing waits on them forever
      return r;
    }
    for (auto& p : posts) M.submit(std::move(p));
    return M.enqueue_in_progress ? M.in_progress(last) : ncclSuccess;
  }

  // --- CUDA runtime ---
  static cudaError_t event_create(cudaEvent_t* e, unsigned flags) {
    auto& M = self();
    std::lock_guard lock(M.m_);
    M.calls_.push_back({.name = "cudaEventCreateWithFlags", .count = flags});
    auto ev = std::make_unique<mock_event>();
    *e = reinterpret_cast<cudaEvent_t>(ev.get());
    M.events_.push_back(std::move(ev));
    return cudaSuccess;
  }
  static cudaError_t event_record(cudaEvent_t e, cudaStream_t st) {
    auto& M = self();
    std::lock_guard lock(M.m_);
    M.calls_.push_back({.name = "cudaEventRecord", .stream = st});
    auto* ev = as_ev(e);
    ev->q = M.queue(st);
    ev->reached = std::make_shared<bool>(false);
    ev->not_ready_polls = M.event_not_ready_polls;
    ev->q->items.push_back({{}, {}, ev->reached});
    progress(*ev->q);
    return cudaSuccess;
  }
  static cudaError_t event_query(cudaEvent_t e) {
    auto& M = self();
    std::lock_guard lock(M.m_);
    auto* ev = as_ev(e);
    if (ev->destroyed) {
      M.problems_.push_back("cudaEventQuery on a destroyed event");
      return cudaErrorInvalidResourceHandle;
    }
    if (M.event_error_ != cudaSuccess) return M.event_error_;
    if (!ev->q) return cudaSuccess;
    progress(*ev->q);
    if (!*ev->reached) return cudaErrorNotReady;
    if (ev->not_ready_polls > 0) {
      --ev->not_ready_polls;
      return cudaErrorNotReady;
    }
    return cudaSuccess;
  }
  static cudaError_t event_destroy(cudaEvent_t e) {
    auto& M = self();
    std::lock_guard lock(M.m_);
    M.calls_.push_back({.name = "cudaEventDestroy"});
    if (as_ev(e)->destroyed) M.problems_.push_back("event destroyed twice");
    as_ev(e)->destroyed = true;
    return cudaSuccess;
  }
  static cudaError_t stream_wait_event(cudaStream_t, cudaEvent_t, unsigned) { return cudaSuccess; }
  static cudaError_t get_device(int* d) {
    *d = ts().device;
    return cudaSuccess;
  }
  static cudaError_t set_device(int d) {
    auto& M = self();
    std::lock_guard lock(M.m_);
    M.calls_.push_back({.name = "cudaSetDevice", .count = std::size_t(d)});
    ts().device = d;
    return cudaSuccess;
  }
  static cudaError_t dev_malloc(void** p, std::size_t n) {
    auto& M = self();
    std::lock_guard lock(M.m_);
    M.calls_.push_back({.name = "cudaMalloc", .count = n});
    *p = std::calloc(n, 1);
    M.allocations_.push_back(*p);
    return cudaSuccess;
  }
  static cudaError_t dev_free(void* p) {
    auto& M = self();
    std::lock_guard lock(M.m_);
    M.calls_.push_back({.name = "cudaFree"});
    auto it = std::find(M.allocations_.begin(), M.allocations_.end(), p);
    if (it == M.allocations_.end()) {
      M.problems_.push_back("cudaFree of an unknown pointer");
      return cudaErrorInvalidValue;
    }
    M.allocations_.erase(it);
    std::free(p);
    return cudaSuccess;
  }
  static cudaError_t memcpy_async(void* d, void const* s, std::size_t n, cudaMemcpyKind kind,
                                  cudaStream_t st) {
    auto& M = self();
    std::lock_guard lock(M.m_);
    M.calls_.push_back({.name = "cudaMemcpyAsync", .send = s, .recv = d, .count = n, .stream = st});
    // Runs when the stream reaches it; a host source is staged now, as CUDA does for pageable
    // memory, while a device source is read when the copy runs (after the work before it).
    auto staged = kind == cudaMemcpyHostToDevice ? std::make_shared<std::vector<unsigned char>>(
                                                       static_cast<unsigned char const*>(s),
                                                       static_cast<unsigned char const*>(s) + n)
                                                 : nullptr;
    auto q = M.queue(st);
    q->items.push_back({{}, [=] { std::memcpy(d, staged ? staged->data() : s, n); }, {}});
    progress(*q);
    return cudaSuccess;
  }
  static char const* cuda_error_name(cudaError_t e) {
    switch (e) {
      case cudaSuccess: return "cudaSuccess";
      case cudaErrorNotReady: return "cudaErrorNotReady";
      case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
      case cudaErrorIllegalAddress: return "cudaErrorIllegalAddress";
      default: return "cudaError (mock)";
    }
  }

  mutable std::mutex m_;
  std::vector<call> calls_;
  std::vector<failure> failures_;
  std::vector<std::string> problems_;
  std::map<std::uint64_t, std::shared_ptr<group_state>> groups_;
  std::vector<std::unique_ptr<comm_obj>> comms_;
  std::vector<std::unique_ptr<mock_event>> events_;
  std::map<std::pair<std::thread::id, void*>, std::shared_ptr<stream_q>> streams_;
  std::vector<void*> allocations_;
  std::uint64_t next_key_ = 0;
  cudaError_t event_error_ = cudaSuccess;
};

}  // namespace weft::test::nccl_mock

//! The mock's former namespace, kept while tests still name it.
namespace weft_test {
namespace nccl_mock = weft::test::nccl_mock;
}  // namespace weft_test
