// weft/comm/detail/plan.hpp — the backend-independent rules of every operation, written once:
// what is checked (with one message text per check), what every rank must agree on (the
// fingerprint), how many bytes move, which buffer layout means "in place", and when a call is
// trivial (nothing to move: a local no-op, recorded like any other operation). A backend calls
// plan_<op> before anything moves and keeps only its transport.
#pragma once

#include <weft/comm/concepts.hpp>
#include <weft/comm/detail/buffers.hpp>
#include <weft/comm/detail/checked.hpp>
#include <weft/comm/reference.hpp>
#include <weft/core/dtype.hpp>
#include <weft/core/error.hpp>

#include <chrono>
#include <cstddef>
#include <limits>
#include <span>
#include <string>
#include <vector>

namespace weft::comm::detail {

//! What the backend is, as far as the rules care: this rank, the group size, and the memory its
//! buffers must live in (`why` is quoted by the message; `device` >= 0 also requires
//! buffer_view::device to be it or -1).
struct endpoint {
  int rank = -1;
  int size = 0;
  memory_kind where = memory_kind::host;
  int device = -1;
  char const* why = "";
};

//! The outcome of the rules for one call on this rank.
struct call_plan {
  fingerprint fp{};  // seq is filled by the backend when the call is sequenced
  std::size_t send_bytes = 0;
  std::size_t recv_bytes = 0;
  int root_or_peer = -1;
  bool is_root = true;    // rooted ops: this rank is the root (always true for the others)
  bool in_place = false;  // the one in-place form this op allows, detected once
  bool trivial = false;   // nothing to move: a local no-op, recorded like any other operation
  std::vector<std::size_t> offsets;   // _v ops: element offsets of the blocks (send side)
  std::vector<std::size_t> offsets2;  // all_to_all_v: element offsets of the received blocks

  //! The record of this call, started at `start`.
  [[nodiscard]] op_record record(std::chrono::steady_clock::time_point start) const {
    op_record r;
    r.op = fp.op;
    r.type = fp.type;
    r.send_bytes = send_bytes;
    r.recv_bytes = recv_bytes;
    r.root_or_peer = root_or_peer;
    r.start = start;
    r.end = start;
    return r;
  }
};

// ---- the checks, one text each ------------------------------------------------------------------

inline void check_member(bool member) {
  WEFT_EXPECTS(member, "communicator", "a member communicator (size() > 0)",
               "a non-member (default-constructed, moved-from, or split with a negative color)");
}

//! The deadline of a call: op_options::timeout, or the communicator's default when it is 0.
inline std::chrono::milliseconds call_timeout(op_options const& o, std::chrono::milliseconds dflt) {
  WEFT_EXPECTS(o.timeout.count() >= 0, "options.timeout", ">= 0 ms (0: the communicator's default)",
               o.timeout.count());
  return o.timeout.count() > 0 ? o.timeout : dflt;
}

inline void check_rank(endpoint const& ep, int r, char const* name) {
  WEFT_EXPECTS(r >= 0 && r < ep.size, name, weft::detail::concat("a rank in [0, ", ep.size, ")"),
               r);
}

inline void check_buffer(endpoint const& ep, buffer_view const& b, char const* name) {
  WEFT_EXPECTS(weft::detail::is_valid(b.type), weft::detail::concat(name, ".type"),
               "one of f32, f64, bf16, f16, i32, i64, u8", b.type);
  WEFT_EXPECTS(b.where == ep.where, weft::detail::concat(name, ".where"),
               weft::detail::concat(to_string(ep.where), " memory (", ep.why, ")"),
               to_string(b.where));
  WEFT_EXPECTS(b.count == 0 || b.data != nullptr, weft::detail::concat(name, ".data"),
               "non-null when count > 0", "nullptr");
  if (b.count > std::numeric_limits<std::size_t>::max() / size_of(b.type)) [[unlikely]]
    (void)checked_bytes(b.count, b.type, weft::detail::concat(name, ".count"));
  if (ep.device >= 0)
    WEFT_EXPECTS(b.device < 0 || b.device == ep.device, weft::detail::concat(name, ".device"),
                 weft::detail::concat(ep.device, " (this communicator's device) or -1"), b.device);
}

inline void check_same_type(buffer_view const& in, buffer_view const& out) {
  WEFT_EXPECTS(out.type == in.type, "out.type", weft::detail::concat("in.type = ", in.type),
               out.type);
}

//! `form` is the in-place layout the op allows ("out == in").
inline void check_in_place_or_disjoint(buffer_view const& in, buffer_view const& out, bool in_place,
                                       char const* form) {
  WEFT_EXPECTS(in_place || !overlap(in, out), "out",
               weft::detail::concat("disjoint from `in`, or exactly ", form, " (in-place)"),
               "a partial overlap with `in`");
}

inline void check_counts(endpoint const& ep, std::span<std::size_t const> counts,
                         char const* name) {
  WEFT_EXPECTS(counts.size() == static_cast<std::size_t>(ep.size),
               weft::detail::concat(name, ".size()"), weft::detail::concat("size() = ", ep.size),
               counts.size());
}

//! `actual` must equal `expected`, which the message spells as "<how> = <expected>".
inline void expect_count(std::size_t actual, std::size_t expected, char const* name,
                         char const* how) {
  WEFT_EXPECTS_SHAPE(actual == expected, name, weft::detail::concat(how, " = ", expected), actual);
}

inline std::size_t me(endpoint const& ep) noexcept { return static_cast<std::size_t>(ep.rank); }
inline std::size_t group_size(endpoint const& ep) noexcept {
  return static_cast<std::size_t>(ep.size);
}

// ---- one plan per operation -----------------------------------------------------------------

inline call_plan plan_all_reduce(endpoint const& ep, buffer_view const& in, buffer_view const& out,
                                 reduce_op op) {
  check_buffer(ep, in, "in");
  check_buffer(ep, out, "out");
  check_same_type(in, out);
  expect_count(out.count, in.count, "out.count", "in.count");
  call_plan p;
  p.in_place = in.data == out.data;
  check_in_place_or_disjoint(in, out, p.in_place, "out == in");
  validate_reduce_op(op, in.type);
  p.fp = {op_kind::all_reduce, in.type, in.count, -1, op.kind, 0};
  p.send_bytes = in.bytes();
  p.recv_bytes = out.bytes();
  p.trivial = in.count == 0;
  return p;
}

//! `out` is read on the root only.
inline call_plan plan_reduce(endpoint const& ep, buffer_view const& in, buffer_view const& out,
                             reduce_op op, int root) {
  check_rank(ep, root, "root");
  check_buffer(ep, in, "in");
  call_plan p;
  p.is_root = root == ep.rank;
  if (p.is_root) {
    check_buffer(ep, out, "out");
    check_same_type(in, out);
    expect_count(out.count, in.count, "out.count (on the root)", "in.count");
    p.in_place = in.data == out.data;
    check_in_place_or_disjoint(in, out, p.in_place, "out == in");
  }
  validate_reduce_op(op, in.type);
  p.fp = {op_kind::reduce, in.type, in.count, root, op.kind, 0};
  p.root_or_peer = root;
  p.send_bytes = in.bytes();
  p.recv_bytes = p.is_root ? in.bytes() : 0;
  p.trivial = in.count == 0;
  return p;
}

//! `in` is read on the root only.
inline call_plan plan_broadcast(endpoint const& ep, buffer_view const& in, buffer_view const& out,
                                int root) {
  check_rank(ep, root, "root");
  check_buffer(ep, out, "out");
  call_plan p;
  p.is_root = root == ep.rank;
  if (p.is_root) {
    check_buffer(ep, in, "in");
    check_same_type(in, out);
    expect_count(in.count, out.count, "in.count (on the root)", "out.count");
    p.in_place = in.data == out.data;
    check_in_place_or_disjoint(in, out, p.in_place, "out == in");
  }
  p.fp = {op_kind::broadcast, out.type, out.count, root, reduce_kind::sum, 0};
  p.root_or_peer = root;
  p.send_bytes = p.is_root ? in.bytes() : 0;
  p.recv_bytes = out.bytes();
  p.trivial = out.count == 0;
  return p;
}

inline call_plan plan_all_gather(endpoint const& ep, buffer_view const& in,
                                 buffer_view const& out) {
  check_buffer(ep, in, "in");
  check_buffer(ep, out, "out");
  check_same_type(in, out);
  expect_count(out.count, checked_mul(group_size(ep), in.count, "size() * in.count"), "out.count",
               "size() * in.count");
  call_plan p;
  p.in_place = in.count != 0 && in.data == byte_offset(out.data, me(ep) * in.count, in.type);
  check_in_place_or_disjoint(in, out, p.in_place, "in == out + rank() * in.count");
  p.fp = {op_kind::all_gather, in.type, in.count, -1, reduce_kind::sum, 0};
  p.send_bytes = in.bytes();
  p.recv_bytes = out.bytes();
  p.trivial = in.count == 0;
  return p;
}

inline call_plan plan_all_gather_v(endpoint const& ep, buffer_view const& in,
                                   buffer_view const& out, std::span<std::size_t const> counts) {
  check_counts(ep, counts, "counts");
  check_buffer(ep, in, "in");
  check_buffer(ep, out, "out");
  check_same_type(in, out);
  call_plan p;
  p.offsets = checked_offsets(counts, in.type, "counts");
  expect_count(in.count, counts[me(ep)], "in.count", "counts[rank()]");
  expect_count(out.count, p.offsets.back(), "out.count", "sum(counts)");
  p.in_place = in.count != 0 && in.data == byte_offset(out.data, p.offsets[me(ep)], in.type);
  check_in_place_or_disjoint(in, out, p.in_place,
                             "in == out + (counts[0] + ... + counts[rank()-1])");
  p.fp = {op_kind::all_gather_v, in.type, 0, -1, reduce_kind::sum, 0};
  p.send_bytes = in.bytes();
  p.recv_bytes = out.bytes();
  p.trivial = p.offsets.back() == 0;
  return p;
}

inline call_plan plan_reduce_scatter(endpoint const& ep, buffer_view const& in,
                                     buffer_view const& out, reduce_op op) {
  check_buffer(ep, in, "in");
  check_buffer(ep, out, "out");
  check_same_type(in, out);
  expect_count(in.count, checked_mul(group_size(ep), out.count, "size() * out.count"), "in.count",
               "size() * out.count");
  call_plan p;
  p.in_place = out.count != 0 && out.data == byte_offset(in.data, me(ep) * out.count, in.type);
  check_in_place_or_disjoint(in, out, p.in_place, "out == in + rank() * out.count");
  validate_reduce_op(op, in.type);
  p.fp = {op_kind::reduce_scatter, in.type, out.count, -1, op.kind, 0};
  p.send_bytes = in.bytes();
  p.recv_bytes = out.bytes();
  p.trivial = out.count == 0;
  return p;
}

inline call_plan plan_reduce_scatter_v(endpoint const& ep, buffer_view const& in,
                                       buffer_view const& out, std::span<std::size_t const> counts,
                                       reduce_op op) {
  check_counts(ep, counts, "counts");
  check_buffer(ep, in, "in");
  check_buffer(ep, out, "out");
  check_same_type(in, out);
  call_plan p;
  p.offsets = checked_offsets(counts, in.type, "counts");
  expect_count(out.count, counts[me(ep)], "out.count", "counts[rank()]");
  expect_count(in.count, p.offsets.back(), "in.count", "sum(counts)");
  p.in_place = out.count != 0 && out.data == byte_offset(in.data, p.offsets[me(ep)], in.type);
  check_in_place_or_disjoint(in, out, p.in_place,
                             "out == in + (counts[0] + ... + counts[rank()-1])");
  validate_reduce_op(op, in.type);
  p.fp = {op_kind::reduce_scatter_v, in.type, 0, -1, op.kind, 0};
  p.send_bytes = in.bytes();
  p.recv_bytes = out.bytes();
  p.trivial = p.offsets.back() == 0;
  return p;
}

//! In place (out == in) on every backend: the input is read from a copy.
inline call_plan plan_all_to_all(endpoint const& ep, buffer_view const& in,
                                 buffer_view const& out) {
  check_buffer(ep, in, "in");
  check_buffer(ep, out, "out");
  check_same_type(in, out);
  expect_count(out.count, in.count, "out.count", "in.count");
  WEFT_EXPECTS_SHAPE(in.count % group_size(ep) == 0, "in.count",
                     weft::detail::concat("a multiple of size() = ", ep.size), in.count);
  call_plan p;
  p.in_place = in.count != 0 && in.data == out.data;
  check_in_place_or_disjoint(in, out, p.in_place, "out == in");
  p.fp = {op_kind::all_to_all, in.type, in.count, -1, reduce_kind::sum, 0};
  p.send_bytes = in.bytes();
  p.recv_bytes = out.bytes();
  p.trivial = in.count == 0;
  return p;
}

//! Never trivial: whether anything moves depends on the peers' counts.
inline call_plan plan_all_to_all_v(endpoint const& ep, buffer_view const& in,
                                   buffer_view const& out, std::span<std::size_t const> send_counts,
                                   std::span<std::size_t const> recv_counts) {
  check_counts(ep, send_counts, "send_counts");
  check_counts(ep, recv_counts, "recv_counts");
  check_buffer(ep, in, "in");
  check_buffer(ep, out, "out");
  check_same_type(in, out);
  call_plan p;
  p.offsets = checked_offsets(send_counts, in.type, "send_counts");
  p.offsets2 = checked_offsets(recv_counts, in.type, "recv_counts");
  expect_count(in.count, p.offsets.back(), "in.count", "sum(send_counts)");
  expect_count(out.count, p.offsets2.back(), "out.count", "sum(recv_counts)");
  expect_count(recv_counts[me(ep)], send_counts[me(ep)], "recv_counts[rank()]",
               "send_counts[rank()]");
  p.in_place = in.count != 0 && in.data == out.data;
  check_in_place_or_disjoint(in, out, p.in_place, "out == in");
  p.fp = {op_kind::all_to_all_v, in.type, 0, -1, reduce_kind::sum, 0};
  p.send_bytes = in.bytes();
  p.recv_bytes = out.bytes();
  return p;
}

//! Rooted gather (`gather`) and scatter (`!gather`) mirror each other: the root's big buffer holds
//! size() blocks of the small one, and the root's own block may be the small buffer (in place).
inline call_plan plan_rooted(endpoint const& ep, buffer_view const& in, buffer_view const& out,
                             int root, bool gather) {
  check_rank(ep, root, "root");
  buffer_view const& small = gather ? in : out;
  buffer_view const& big = gather ? out : in;
  check_buffer(ep, small, gather ? "in" : "out");
  call_plan p;
  p.is_root = root == ep.rank;
  if (p.is_root) {
    check_buffer(ep, big, gather ? "out" : "in");
    check_same_type(in, out);
    char const* how = gather ? "size() * in.count" : "size() * out.count";
    expect_count(big.count, checked_mul(group_size(ep), small.count, how),
                 gather ? "out.count (on the root)" : "in.count (on the root)", how);
    p.in_place =
        small.count != 0 && small.data == byte_offset(big.data, me(ep) * small.count, small.type);
    check_in_place_or_disjoint(
        in, out, p.in_place,
        gather ? "in == out + root * in.count" : "out == in + root * out.count");
  }
  p.fp = {gather ? op_kind::gather : op_kind::scatter,
          small.type,
          small.count,
          root,
          reduce_kind::sum,
          0};
  p.root_or_peer = root;
  (gather ? p.send_bytes : p.recv_bytes) = small.bytes();
  (gather ? p.recv_bytes : p.send_bytes) = p.is_root ? big.bytes() : 0;
  p.trivial = small.count == 0;
  return p;
}

inline call_plan plan_gather(endpoint const& ep, buffer_view const& in, buffer_view const& out,
                             int root) {
  return plan_rooted(ep, in, out, root, true);
}
inline call_plan plan_scatter(endpoint const& ep, buffer_view const& in, buffer_view const& out,
                              int root) {
  return plan_rooted(ep, in, out, root, false);
}

//! send (`op_kind::send`, `b` is read) or recv (`b` is written). Sending to one's own rank is
//! allowed on every backend (it pairs with a receive from oneself); count 0 is a local no-op.
inline call_plan plan_p2p(endpoint const& ep, op_kind kind, buffer_view const& b, int peer) {
  check_rank(ep, peer, "peer");
  check_buffer(ep, b, kind == op_kind::send ? "in" : "out");
  call_plan p;
  p.fp = {kind, b.type, b.count, -1, reduce_kind::sum, 0};
  p.root_or_peer = peer;
  (kind == op_kind::send ? p.send_bytes : p.recv_bytes) = b.bytes();
  p.trivial = b.count == 0;
  return p;
}

//! The blocking form of a host backend's send/recv: waits for the pending work and returns it
//! completed.
inline work blocking(work w) {
  w.wait();
  return work{};
}

//! barrier and split: nothing to check; never trivial (always a synchronisation point).
inline call_plan plan_sync(op_kind kind) {
  call_plan p;
  p.fp = {kind, dtype::u8, 0, -1, reduce_kind::sum, 0};
  return p;
}

}  // namespace weft::comm::detail
