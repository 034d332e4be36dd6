// tests/support/counting_communicator.hpp — a Communicator wrapper that records every operation a
// rank issues with its element counts and byte volumes, so tests of other areas can assert
// communication volumes (e.g. "one all_reduce of B*H floats per tensor-parallel forward").
#pragma once

#include <weft/comm/collectives.hpp>
#include <weft/comm/concepts.hpp>

#include <cstddef>
#include <memory>
#include <numeric>
#include <span>
#include <utility>
#include <vector>

namespace weft::test {

//! One operation as issued by this rank (recorded when the call returns without throwing, so
//! rejected arguments are not counted).
//! Volume rule, independent of the backend's algorithm: send_bytes is what this rank contributes
//! (in.bytes(), for broadcast and scatter on the root only; 0 for recv, barrier and split);
//! recv_bytes is what it receives into (out.bytes(), for reduce and gather on the root only).
struct comm_event {
  comm::op_kind op = comm::op_kind::barrier;
  dtype type = dtype::f32;
  std::size_t send_count = 0;
  std::size_t recv_count = 0;
  std::size_t send_bytes = 0;
  std::size_t recv_bytes = 0;
  int root_or_peer = -1;
  int comm_id = 0;     // 0: the wrapped communicator; 1, 2, ...: communicators split from it
  int group_size = 0;  // size() of the communicator it was issued on
};

//! The events of one rank, shared by a counting_communicator and every one split from it.
struct comm_log {
  std::vector<comm_event> events;
  int next_id = 1;
};

template <comm::Communicator C>
class counting_communicator {
 public:
  using communicator_concept = typename C::communicator_concept;
  using memory_space = comm::communicator_space_t<C>;

  //! Takes ownership of `inner` (move a threads::communicator& from run_ranks into it).
  explicit counting_communicator(C inner)
      : inner_(std::move(inner)), log_(std::make_shared<comm_log>()) {}

  // ---- queries --------------------------------------------------------------------------------
  [[nodiscard]] C& inner() noexcept { return inner_; }
  [[nodiscard]] int id() const noexcept { return id_; }
  //! Every event of this rank, on this communicator and those split from it, in issue order.
  [[nodiscard]] std::vector<comm_event> const& events() const noexcept { return log_->events; }
  //! Events issued on this communicator only.
  [[nodiscard]] std::vector<comm_event> own_events() const {
    std::vector<comm_event> out;
    for (auto const& e : log_->events)
      if (e.comm_id == id_) out.push_back(e);
    return out;
  }
  [[nodiscard]] std::size_t count(comm::op_kind op) const {
    std::size_t n = 0;
    for (auto const& e : log_->events) n += e.op == op && e.comm_id == id_ ? 1 : 0;
    return n;
  }
  //! Sum of send_bytes over this communicator's events (of one kind, or all).
  [[nodiscard]] std::size_t bytes_sent() const { return sum(&comm_event::send_bytes, nullptr); }
  [[nodiscard]] std::size_t bytes_sent(comm::op_kind op) const {
    return sum(&comm_event::send_bytes, &op);
  }
  [[nodiscard]] std::size_t bytes_received() const { return sum(&comm_event::recv_bytes, nullptr); }
  void clear() { log_->events.clear(); }

  // ---- Communicator ---------------------------------------------------------------------------
  [[nodiscard]] int rank() const noexcept { return inner_.rank(); }
  [[nodiscard]] int size() const noexcept { return inner_.size(); }
  [[nodiscard]] comm::comm_state state() const noexcept { return inner_.state(); }

  comm::work all_reduce(comm::buffer_view in, comm::buffer_view out, comm::reduce_op op = {},
                        comm::op_options o = {}) {
    auto w = inner_.all_reduce(in, out, op, o);
    add(comm::op_kind::all_reduce, in, out, -1);
    return w;
  }
  comm::work reduce(comm::buffer_view in, comm::buffer_view out, comm::reduce_op op, int root,
                    comm::op_options o = {}) {
    auto w = inner_.reduce(in, out, op, root, o);
    add(comm::op_kind::reduce, in, rank() == root ? out : empty(out), root);
    return w;
  }
  comm::work broadcast(comm::buffer_view in, comm::buffer_view out, int root,
                       comm::op_options o = {}) {
    auto w = inner_.broadcast(in, out, root, o);
    add(comm::op_kind::broadcast, rank() == root ? in : empty(out), out, root);
    return w;
  }
  comm::work all_gather(comm::buffer_view in, comm::buffer_view out, comm::op_options o = {}) {
    auto w = inner_.all_gather(in, out, o);
    add(comm::op_kind::all_gather, in, out, -1);
    return w;
  }
  comm::work all_gather_v(comm::buffer_view in, comm::buffer_view out,
                          std::span<std::size_t const> counts, comm::op_options o = {}) {
    auto w = inner_.all_gather_v(in, out, counts, o);
    add(comm::op_kind::all_gather_v, in, out, -1);
    return w;
  }
  comm::work reduce_scatter(comm::buffer_view in, comm::buffer_view out, comm::reduce_op op = {},
                            comm::op_options o = {}) {
    auto w = inner_.reduce_scatter(in, out, op, o);
    add(comm::op_kind::reduce_scatter, in, out, -1);
    return w;
  }
  comm::work reduce_scatter_v(comm::buffer_view in, comm::buffer_view out,
                              std::span<std::size_t const> counts, comm::reduce_op op = {},
                              comm::op_options o = {}) {
    auto w = inner_.reduce_scatter_v(in, out, counts, op, o);
    add(comm::op_kind::reduce_scatter_v, in, out, -1);
    return w;
  }
  comm::work all_to_all(comm::buffer_view in, comm::buffer_view out, comm::op_options o = {}) {
    auto w = inner_.all_to_all(in, out, o);
    add(comm::op_kind::all_to_all, in, out, -1);
    return w;
  }
  comm::work all_to_all_v(comm::buffer_view in, comm::buffer_view out,
                          std::span<std::size_t const> send_counts,
                          std::span<std::size_t const> recv_counts, comm::op_options o = {}) {
    auto w = inner_.all_to_all_v(in, out, send_counts, recv_counts, o);
    add(comm::op_kind::all_to_all_v, in, out, -1);
    return w;
  }
  comm::work gather(comm::buffer_view in, comm::buffer_view out, int root,
                    comm::op_options o = {}) {
    auto w = inner_.gather(in, out, root, o);
    add(comm::op_kind::gather, in, rank() == root ? out : empty(out), root);
    return w;
  }
  comm::work scatter(comm::buffer_view in, comm::buffer_view out, int root,
                     comm::op_options o = {}) {
    auto w = inner_.scatter(in, out, root, o);
    add(comm::op_kind::scatter, rank() == root ? in : empty(out), out, root);
    return w;
  }
  comm::work send(comm::buffer_view in, int peer, comm::op_options o = {}) {
    auto w = inner_.send(in, peer, o);
    add(comm::op_kind::send, in, empty(in), peer);
    return w;
  }
  comm::work recv(comm::buffer_view out, int peer, comm::op_options o = {}) {
    auto w = inner_.recv(out, peer, o);
    add(comm::op_kind::recv, empty(out), out, peer);
    return w;
  }
  //! Recorded as send / recv at issue.
  comm::work isend(comm::buffer_view in, int peer, comm::op_options o = {}) {
    auto w = inner_.isend(in, peer, o);
    add(comm::op_kind::send, in, empty(in), peer);
    return w;
  }
  comm::work irecv(comm::buffer_view out, int peer, comm::op_options o = {}) {
    auto w = inner_.irecv(out, peer, o);
    add(comm::op_kind::recv, empty(out), out, peer);
    return w;
  }
  comm::work barrier(comm::op_options o = {}) {
    auto w = inner_.barrier(o);
    add(comm::op_kind::barrier, {}, {}, -1);
    return w;
  }
  //! The child wraps the inner split and shares this rank's log under a new comm_id.
  counting_communicator split(int color, int key) {
    C child = inner_.split(color, key);
    add(comm::op_kind::split, {}, {}, -1);
    return counting_communicator(std::move(child), log_, log_->next_id++);
  }
  void abort() noexcept { inner_.abort(); }
  [[nodiscard]] std::vector<comm::op_record> history() const { return inner_.history(); }
  void set_hook(comm::op_hook hook) { inner_.set_hook(std::move(hook)); }

  void synchronize(comm::op_options o) requires requires(C& c, comm::op_options oo) {
    c.synchronize(oo);
  }
  { inner_.synchronize(o); }

 private:
  counting_communicator(C inner, std::shared_ptr<comm_log> log, int id)
      : inner_(std::move(inner)), log_(std::move(log)), id_(id) {}

  static comm::buffer_view empty(comm::buffer_view b) {
    b.count = 0;
    return b;
  }

  void add(comm::op_kind op, comm::buffer_view in, comm::buffer_view out, int root_or_peer) {
    comm_event e;
    e.op = op;
    e.type = in.count != 0 ? in.type : out.type;
    e.send_count = in.count;
    e.recv_count = out.count;
    e.send_bytes = in.count == 0 ? 0 : in.bytes();
    e.recv_bytes = out.count == 0 ? 0 : out.bytes();
    e.root_or_peer = root_or_peer;
    e.comm_id = id_;
    e.group_size = size();
    log_->events.push_back(e);
  }

  std::size_t sum(std::size_t comm_event::*field, comm::op_kind const* op) const {
    std::size_t s = 0;
    for (auto const& e : log_->events)
      if (e.comm_id == id_ && (op == nullptr || e.op == *op)) s += e.*field;
    return s;
  }

  C inner_;
  std::shared_ptr<comm_log> log_;
  int id_ = 0;
};

}  // namespace weft::test
