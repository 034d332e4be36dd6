// tests/support/conformance.hpp — the Communicator conformance checks, as templates over any
// Communicator: every rank computes its input from (rank, index) alone and the expected result
// locally with the serial rank-ordered reference, so the same checks run on ranks that are threads
// (threads backend, the NCCL mock) or separate processes (MPI backend). Buffers reach the
// communicator through make_view<C>, so a backend whose buffers carry another memory kind runs the
// same checks (the NCCL mock: "cuda" buffers that are host memory; tests/comm/nccl/mock_suite.hpp).
#pragma once

#include "support/approx.hpp"

#include <weft/comm/concepts.hpp>
#include <weft/comm/reference.hpp>
#include <weft/core/dtype.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <sstream>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

namespace weft::test {

// ---- where the suites' buffers live ---------------------------------------------------------

//! The default memory policy: a span of host memory is a host buffer_view.
struct host_memory {
  template <class T>
  [[nodiscard]] static comm::buffer_view view(std::span<T> s) noexcept {
    return comm::host_view(s);
  }
};

//! The hook: which memory policy the shared suites use for communicator C. A policy has a static
//! `view(std::span<T>) -> comm::buffer_view` over memory the test can read and write on the host.
//! Specialise it (before the first use, in one header every user includes) for a backend whose
//! buffers must say another memory kind.
template <class C>
struct memory_of {
  using type = host_memory;
};
template <class C>
using memory_for = typename memory_of<C>::type;

//! The buffer_view communicator C accepts for `s`.
template <class C, class T>
[[nodiscard]] comm::buffer_view make_view(std::span<T> s) {
  return memory_for<C>::view(s);
}

//! The one rule for a message to one's own rank (send/isend/recv/irecv with peer == rank()):
//! true: every backend delivers it like any other message, an isend to oneself pairing with a
//! recv from oneself (docs/comm.md, comm/detail/plan.hpp); false: every backend rejects it with
//! invalid_argument_error naming `peer`. tests/support/faults.hpp checks whichever holds on every
//! backend, conformance::check_send_recv the delivery. Flip here if the rule changes.
inline constexpr bool self_messages_allowed = true;

}  // namespace weft::test

namespace weft::test::conformance {

//! general: values with many significant bits, so a different reduction order gives different
//! bits (the threads backend must match the rank-ordered reference exactly).
//! exact: small integers (and power-of-two premul scalars) whose reductions are exact in the
//! accumulator type, so any reduction order gives the same bits (for backends such as MPI whose
//! order is their own).
enum class input_mode { general, exact };

struct config {
  input_mode mode = input_mode::general;
  //! Element counts tried (per rank for all_gather/gather/scatter/reduce_scatter blocks).
  std::vector<std::size_t> counts = {0, 1, 3, 7, 37, 1000};
  //! Count used for the every-root x every-op sweeps of rooted collectives.
  std::size_t rooted_count = 37;
};

inline constexpr std::array<comm::reduce_kind, 6> all_reduce_kinds = {
    comm::reduce_kind::sum, comm::reduce_kind::prod, comm::reduce_kind::min,
    comm::reduce_kind::max, comm::reduce_kind::avg,  comm::reduce_kind::premul_sum};

// ---- deterministic inputs -------------------------------------------------------------------

inline std::uint64_t mix(std::uint64_t a, std::uint64_t b, std::uint64_t c) noexcept {
  std::uint64_t z =
      a * 0x9e3779b97f4a7c15ull + b * 0xbf58476d1ce4e5b9ull + c * 0x94d049bb133111ebull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

//! The input of `rank` at global element `index` for a reduction of `kind` (other collectives use
//! kind sum); `salt` tells calls apart.
template <Element T>
T input(int rank, std::size_t index, comm::reduce_kind kind, input_mode mode, std::uint64_t salt) {
  std::uint64_t const h = mix(static_cast<std::uint64_t>(rank) + 1, index, salt);
  auto const pick = [&](std::int64_t lo, std::int64_t hi) {  // in [lo, hi]
    return lo + static_cast<std::int64_t>(h % static_cast<std::uint64_t>(hi - lo + 1));
  };
  if constexpr (std::is_integral_v<T>) {
    // Integer sums and products wrap, which is order-independent: any values will do.
    if constexpr (std::is_same_v<T, u8>) {
      return static_cast<T>(pick(0, 255));
    } else if (kind == comm::reduce_kind::prod) {
      return static_cast<T>(pick(-9, 9));
    } else {
      return static_cast<T>(pick(-100000, 100000));
    }
  } else {
    double v = 0.0;
    if (mode == input_mode::exact) {
      if (kind == comm::reduce_kind::prod) {
        constexpr double choices[4] = {-2.0, -1.0, 1.0, 2.0};
        v = choices[h % 4];
      } else {
        v = static_cast<double>(pick(-8, 8));
      }
    } else if (kind == comm::reduce_kind::prod) {
      v = 0.5 + static_cast<double>(pick(0, 1023)) / 1024.0;  // [0.5, 1.5): no overflow in f16
    } else {
      // ~21 significant bits at one of 6 scales: rounding depends on the order of the adds.
      auto const m = static_cast<double>(pick(-(1 << 20), 1 << 20));
      v = std::ldexp(m, -12 - static_cast<int>((h >> 40) % 6));
    }
    if constexpr (std::is_same_v<T, f64>) {
      return v;
    } else {
      return T(static_cast<float>(v));  // bf16/f16: one rounding, nearest-even
    }
  }
}

//! Rank r's reduce_op for `kind`: premul_sum scalars differ per rank (each rank scales its own
//! input); integral for integer dtypes, powers of two in exact mode, inexact in general mode.
template <Element T>
comm::reduce_op op_for(comm::reduce_kind kind, int rank, input_mode mode) {
  if (kind != comm::reduce_kind::premul_sum) return comm::reduce_op{kind};
  if constexpr (std::is_integral_v<T>) {
    return comm::reduce_op::premul(static_cast<double>(rank % 3 + 1));
  } else {
    if (mode == input_mode::exact) return comm::reduce_op::premul(std::ldexp(1.0, rank % 3 - 1));
    return comm::reduce_op::premul(1.0 / static_cast<double>(rank + 3));
  }
}

template <Element T>
std::vector<T> inputs_of(int rank, std::size_t offset, std::size_t count, comm::reduce_kind kind,
                         input_mode mode, std::uint64_t salt) {
  std::vector<T> v(count);
  for (std::size_t i = 0; i < count; ++i) v[i] = input<T>(rank, offset + i, kind, mode, salt);
  return v;
}

//! Elements [offset, offset + count) of the reduction over n ranks, by the serial reference.
template <Element T>
std::vector<T> expected_reduction(int n, std::size_t offset, std::size_t count,
                                  comm::reduce_kind kind, input_mode mode, std::uint64_t salt) {
  std::vector<std::vector<T>> in;
  std::vector<T const*> ptrs;
  std::vector<comm::reduce_op> ops;
  for (int r = 0; r < n; ++r) {
    in.push_back(inputs_of<T>(r, offset, count, kind, mode, salt));
    ops.push_back(op_for<T>(kind, r, mode));
  }
  for (auto const& v : in) ptrs.push_back(v.data());
  std::vector<T> out(count);
  comm::reduce_reference<T>(std::span<T const* const>(ptrs), std::span<comm::reduce_op const>(ops),
                            std::span<T>(out));
  return out;
}

// ---- buffers and comparison -----------------------------------------------------------------

//! A buffer that starts one element into its storage when `misaligned` (so backends meet
//! pointers that are not 16-byte aligned), filled with a sentinel; views through memory policy M.
template <Element T, class M = host_memory>
struct padded {
  std::vector<T> storage;
  std::span<T> span;
  padded(std::size_t count, bool misaligned, T fill = T(static_cast<u8>(0x5a)))
      : storage(count + 1, fill), span(storage.data() + (misaligned ? 1 : 0), count) {}
  [[nodiscard]] comm::buffer_view view() { return M::view(span); }
  [[nodiscard]] comm::buffer_view view(std::size_t offset, std::size_t count) {
    return M::view(span.subspan(offset, count));
  }
};

//! Bitwise comparison (tests/support/approx.hpp, exact tolerance); on failure, one FAIL_CHECK
//! naming everything needed to reproduce it and the first mismatching elements. Returns whether
//! all matched.
template <Element T>
bool same_bits(std::span<T const> got, std::span<T const> want, std::string const& what) {
  return check_close(got, want, tolerance::exact(), what);
}

template <class C>
std::string where(C const& c, char const* op, std::size_t count, std::string const& extra) {
  std::ostringstream w;
  w << op << " rank " << c.rank() << "/" << c.size() << " count " << count << extra;
  return w.str();
}

template <Element T>
std::string tag(comm::reduce_kind kind, bool in_place) {
  return std::string(" dtype ") + std::string(name(dtype_of<T>)) + " op " +
         std::string(comm::to_string(kind)) + (in_place ? " in-place" : " out-of-place");
}

inline std::vector<std::size_t> offsets_of(std::vector<std::size_t> const& counts) {
  std::vector<std::size_t> off(counts.size() + 1, 0);
  for (std::size_t i = 0; i < counts.size(); ++i) off[i + 1] = off[i] + counts[i];
  return off;
}

//! Uneven per-rank counts with zeros: counts[r] = (3r + salt) % 5.
inline std::vector<std::size_t> uneven_counts(int n, std::size_t salt) {
  std::vector<std::size_t> c(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r)
    c[static_cast<std::size_t>(r)] = (3 * static_cast<std::size_t>(r) + salt) % 5;
  return c;
}

// ---- the checks -----------------------------------------------------------------------------
// Each is called by every rank with the same arguments (the collective contract) and asserts
// this rank's result bit for bit.

template <Element T, comm::Communicator C>
void check_all_reduce(C& c, std::size_t count, comm::reduce_kind kind, bool in_place,
                      input_mode mode = input_mode::general) {
  std::uint64_t const salt = 11 + count;
  auto const in = inputs_of<T>(c.rank(), 0, count, kind, mode, salt);
  padded<T, memory_for<C>> out(count, count % 2 == 1);
  auto const op = op_for<T>(kind, c.rank(), mode);
  if (in_place) {
    std::copy(in.begin(), in.end(), out.span.begin());
    c.all_reduce(out.view(), out.view(), op).wait();
  } else {
    c.all_reduce(make_view<C>(std::span<T const>(in)), out.view(), op).wait();
  }
  auto const want = expected_reduction<T>(c.size(), 0, count, kind, mode, salt);
  same_bits<T>(out.span, want, where(c, "all_reduce", count, tag<T>(kind, in_place)));
}

template <Element T, comm::Communicator C>
void check_reduce(C& c, std::size_t count, comm::reduce_kind kind, int root, bool in_place,
                  input_mode mode = input_mode::general) {
  std::uint64_t const salt = 23 + count + static_cast<std::uint64_t>(root);
  auto const in = inputs_of<T>(c.rank(), 0, count, kind, mode, salt);
  padded<T, memory_for<C>> out(count, root % 2 == 1);
  auto const op = op_for<T>(kind, c.rank(), mode);
  if (in_place) {
    std::copy(in.begin(), in.end(), out.span.begin());
    c.reduce(out.view(), out.view(), op, root).wait();
  } else {
    c.reduce(make_view<C>(std::span<T const>(in)), out.view(), op, root).wait();
  }
  if (c.rank() != root) return;  // off the root, `out` is unspecified
  auto const want = expected_reduction<T>(c.size(), 0, count, kind, mode, salt);
  same_bits<T>(out.span, want,
               where(c, "reduce", count, tag<T>(kind, in_place) + " root " + std::to_string(root)));
}

template <Element T, comm::Communicator C>
void check_reduce_scatter(C& c, std::size_t block, comm::reduce_kind kind, bool in_place,
                          input_mode mode = input_mode::general) {
  auto const n = static_cast<std::size_t>(c.size());
  auto const r = static_cast<std::size_t>(c.rank());
  std::uint64_t const salt = 31 + block;
  auto const in = inputs_of<T>(c.rank(), 0, n * block, kind, mode, salt);
  auto const op = op_for<T>(kind, c.rank(), mode);
  padded<T, memory_for<C>> buf(n * block, block % 2 == 1);
  std::span<T const> got;
  if (in_place) {
    std::copy(in.begin(), in.end(), buf.span.begin());
    c.reduce_scatter(buf.view(), buf.view(r * block, block), op).wait();
    got = buf.span.subspan(r * block, block);
  } else {
    c.reduce_scatter(make_view<C>(std::span<T const>(in)), buf.view(0, block), op).wait();
    got = buf.span.subspan(0, block);
  }
  auto const want = expected_reduction<T>(c.size(), r * block, block, kind, mode, salt);
  same_bits<T>(got, want, where(c, "reduce_scatter", block, tag<T>(kind, in_place)));
}

template <Element T, comm::Communicator C>
void check_reduce_scatter_v(C& c, std::vector<std::size_t> const& counts, comm::reduce_kind kind,
                            bool in_place, input_mode mode = input_mode::general) {
  auto const r = static_cast<std::size_t>(c.rank());
  auto const off = offsets_of(counts);
  std::uint64_t const salt = 37 + off.back();
  auto const in = inputs_of<T>(c.rank(), 0, off.back(), kind, mode, salt);
  auto const op = op_for<T>(kind, c.rank(), mode);
  padded<T, memory_for<C>> buf(off.back(), true);
  std::span<T const> got;
  if (in_place) {
    std::copy(in.begin(), in.end(), buf.span.begin());
    c.reduce_scatter_v(buf.view(), buf.view(off[r], counts[r]), counts, op).wait();
    got = buf.span.subspan(off[r], counts[r]);
  } else {
    c.reduce_scatter_v(make_view<C>(std::span<T const>(in)), buf.view(0, counts[r]), counts, op)
        .wait();
    got = buf.span.subspan(0, counts[r]);
  }
  auto const want = expected_reduction<T>(c.size(), off[r], counts[r], kind, mode, salt);
  same_bits<T>(got, want, where(c, "reduce_scatter_v", off.back(), tag<T>(kind, in_place)));
}

template <Element T, comm::Communicator C>
void check_broadcast(C& c, std::size_t count, int root, bool in_place) {
  std::uint64_t const salt = 41 + count;
  auto const mine =
      inputs_of<T>(c.rank(), 0, count, comm::reduce_kind::sum, input_mode::general, salt);
  padded<T, memory_for<C>> out(count, root % 2 == 0);
  if (in_place) {
    std::copy(mine.begin(), mine.end(), out.span.begin());
    c.broadcast(out.view(), out.view(), root).wait();
  } else {
    c.broadcast(make_view<C>(std::span<T const>(mine)), out.view(), root).wait();
  }
  auto const want = inputs_of<T>(root, 0, count, comm::reduce_kind::sum, input_mode::general, salt);
  same_bits<T>(out.span, want,
               where(c, "broadcast", count,
                     std::string(in_place ? " in-place" : " out-of-place") + " root " +
                         std::to_string(root) + " dtype " + std::string(name(dtype_of<T>))));
}

template <Element T, comm::Communicator C>
void check_all_gather(C& c, std::size_t block, bool in_place) {
  auto const n = static_cast<std::size_t>(c.size());
  auto const r = static_cast<std::size_t>(c.rank());
  std::uint64_t const salt = 43 + block;
  // Rank s contributes global elements [s * block, (s + 1) * block).
  auto const mine =
      inputs_of<T>(c.rank(), r * block, block, comm::reduce_kind::sum, input_mode::general, salt);
  padded<T, memory_for<C>> out(n * block, block % 2 == 0);
  if (in_place) {
    std::copy(mine.begin(), mine.end(), out.span.begin() + static_cast<std::ptrdiff_t>(r * block));
    c.all_gather(out.view(r * block, block), out.view()).wait();
  } else {
    c.all_gather(make_view<C>(std::span<T const>(mine)), out.view()).wait();
  }
  std::vector<T> want;
  for (std::size_t s = 0; s < n; ++s) {
    auto const v = inputs_of<T>(static_cast<int>(s), s * block, block, comm::reduce_kind::sum,
                                input_mode::general, salt);
    want.insert(want.end(), v.begin(), v.end());
  }
  same_bits<T>(out.span, want,
               where(c, "all_gather", block,
                     std::string(in_place ? " in-place" : " out-of-place") + " dtype " +
                         std::string(name(dtype_of<T>))));
}

template <Element T, comm::Communicator C>
void check_all_gather_v(C& c, std::vector<std::size_t> const& counts, bool in_place) {
  auto const n = static_cast<std::size_t>(c.size());
  auto const r = static_cast<std::size_t>(c.rank());
  auto const off = offsets_of(counts);
  std::uint64_t const salt = 47 + off.back();
  auto const mine =
      inputs_of<T>(c.rank(), off[r], counts[r], comm::reduce_kind::sum, input_mode::general, salt);
  padded<T, memory_for<C>> out(off.back(), true);
  if (in_place) {
    std::copy(mine.begin(), mine.end(), out.span.begin() + static_cast<std::ptrdiff_t>(off[r]));
    c.all_gather_v(out.view(off[r], counts[r]), out.view(), counts).wait();
  } else {
    c.all_gather_v(make_view<C>(std::span<T const>(mine)), out.view(), counts).wait();
  }
  std::vector<T> want;
  for (std::size_t s = 0; s < n; ++s) {
    auto const v = inputs_of<T>(static_cast<int>(s), off[s], counts[s], comm::reduce_kind::sum,
                                input_mode::general, salt);
    want.insert(want.end(), v.begin(), v.end());
  }
  same_bits<T>(out.span, want,
               where(c, "all_gather_v", off.back(),
                     std::string(in_place ? " in-place" : " out-of-place") + " dtype " +
                         std::string(name(dtype_of<T>))));
}

template <Element T, comm::Communicator C>
void check_all_to_all(C& c, std::size_t block, bool in_place) {
  auto const n = static_cast<std::size_t>(c.size());
  auto const r = static_cast<std::size_t>(c.rank());
  std::uint64_t const salt = 53 + block;
  // Rank s's element j of block d (what s sends to d) is input(s, d * block + j).
  auto const mine =
      inputs_of<T>(c.rank(), 0, n * block, comm::reduce_kind::sum, input_mode::general, salt);
  padded<T, memory_for<C>> out(n * block, block % 2 == 1);
  if (in_place) {
    std::copy(mine.begin(), mine.end(), out.span.begin());
    c.all_to_all(out.view(), out.view()).wait();
  } else {
    c.all_to_all(make_view<C>(std::span<T const>(mine)), out.view()).wait();
  }
  std::vector<T> want;
  for (std::size_t s = 0; s < n; ++s) {
    auto const v = inputs_of<T>(static_cast<int>(s), r * block, block, comm::reduce_kind::sum,
                                input_mode::general, salt);
    want.insert(want.end(), v.begin(), v.end());
  }
  same_bits<T>(out.span, want,
               where(c, "all_to_all", block,
                     std::string(in_place ? " in-place" : " out-of-place") + " dtype " +
                         std::string(name(dtype_of<T>))));
}

//! Rank s sends pair_count(s, d, salt) elements to rank d: uneven, with zeros.
inline std::size_t pair_count(std::size_t s, std::size_t d, std::size_t salt) {
  return (s + 2 * d + salt) % 4;
}

template <Element T, comm::Communicator C>
void check_all_to_all_v(C& c, std::size_t salt, bool in_place) {
  auto const n = static_cast<std::size_t>(c.size());
  auto const r = static_cast<std::size_t>(c.rank());
  std::vector<std::size_t> send(n);
  std::vector<std::size_t> recv(n);
  for (std::size_t d = 0; d < n; ++d) send[d] = pair_count(r, d, salt);
  for (std::size_t s = 0; s < n; ++s) recv[s] = pair_count(s, r, salt);
  auto const soff = offsets_of(send);
  auto const roff = offsets_of(recv);
  // What s sends to d is input(s, 1000 * d + j): the index names the destination.
  std::vector<T> mine;
  for (std::size_t d = 0; d < n; ++d)
    for (std::size_t j = 0; j < send[d]; ++j)
      mine.push_back(
          input<T>(c.rank(), 1000 * d + j, comm::reduce_kind::sum, input_mode::general, salt));
  std::size_t const total = std::max(soff.back(), roff.back());
  padded<T, memory_for<C>> out(in_place ? total : roff.back(), true);
  if (in_place) {
    std::copy(mine.begin(), mine.end(), out.span.begin());
    c.all_to_all_v(out.view(0, soff.back()), out.view(0, roff.back()), send, recv).wait();
  } else {
    c.all_to_all_v(make_view<C>(std::span<T const>(mine)), out.view(), send, recv).wait();
  }
  std::vector<T> want;
  for (std::size_t s = 0; s < n; ++s)
    for (std::size_t j = 0; j < recv[s]; ++j)
      want.push_back(input<T>(static_cast<int>(s), 1000 * r + j, comm::reduce_kind::sum,
                              input_mode::general, salt));
  same_bits<T>(out.span.subspan(0, roff.back()), want,
               where(c, "all_to_all_v", roff.back(),
                     std::string(in_place ? " in-place" : " out-of-place") + " salt " +
                         std::to_string(salt) + " dtype " + std::string(name(dtype_of<T>))));
}

template <Element T, comm::Communicator C>
void check_gather(C& c, std::size_t block, int root, bool in_place) {
  auto const n = static_cast<std::size_t>(c.size());
  auto const r = static_cast<std::size_t>(c.rank());
  std::uint64_t const salt = 59 + block;
  auto const mine =
      inputs_of<T>(c.rank(), r * block, block, comm::reduce_kind::sum, input_mode::general, salt);
  padded<T, memory_for<C>> out(n * block, root % 2 == 1);
  if (in_place && c.rank() == root) {
    std::copy(mine.begin(), mine.end(), out.span.begin() + static_cast<std::ptrdiff_t>(r * block));
    c.gather(out.view(r * block, block), out.view(), root).wait();
  } else {
    c.gather(make_view<C>(std::span<T const>(mine)), out.view(), root).wait();
  }
  if (c.rank() != root) return;
  std::vector<T> want;
  for (std::size_t s = 0; s < n; ++s) {
    auto const v = inputs_of<T>(static_cast<int>(s), s * block, block, comm::reduce_kind::sum,
                                input_mode::general, salt);
    want.insert(want.end(), v.begin(), v.end());
  }
  same_bits<T>(out.span, want,
               where(c, "gather", block,
                     std::string(in_place ? " in-place" : " out-of-place") + " root " +
                         std::to_string(root) + " dtype " + std::string(name(dtype_of<T>))));
}

template <Element T, comm::Communicator C>
void check_scatter(C& c, std::size_t block, int root, bool in_place) {
  auto const n = static_cast<std::size_t>(c.size());
  auto const r = static_cast<std::size_t>(c.rank());
  std::uint64_t const salt = 61 + block;
  // The root holds input(root, i) for i < n * block; rank s receives block s.
  auto const all =
      inputs_of<T>(root, 0, n * block, comm::reduce_kind::sum, input_mode::general, salt);
  std::span<T const> got;
  padded<T, memory_for<C>> buf(n * block, root % 2 == 0);
  if (in_place && c.rank() == root) {
    std::copy(all.begin(), all.end(), buf.span.begin());
    c.scatter(buf.view(), buf.view(r * block, block), root).wait();
    got = buf.span.subspan(r * block, block);
  } else {
    c.scatter(make_view<C>(std::span<T const>(all)), buf.view(0, block), root).wait();
    got = buf.span.subspan(0, block);
  }
  std::vector<T> const want(all.begin() + static_cast<std::ptrdiff_t>(r * block),
                            all.begin() + static_cast<std::ptrdiff_t>((r + 1) * block));
  same_bits<T>(got, want,
               where(c, "scatter", block,
                     std::string(in_place ? " in-place" : " out-of-place") + " root " +
                         std::to_string(root) + " dtype " + std::string(name(dtype_of<T>))));
}

//! Point-to-point: a ring of isend/irecv in both directions with several messages in flight per
//! pair (which must arrive in order), blocking pair exchanges, and a message to oneself where
//! self_messages_allowed.
template <Element T, comm::Communicator C>
void check_send_recv(C& c, std::size_t count) {
  int const n = c.size();
  int const r = c.rank();
  int const next = (r + 1) % n;
  int const prev = (r + n - 1) % n;
  constexpr int messages = 3;
  // Message m of stream k (0: to next, 1: to prev) from `from` to `to`.
  auto const value = [&](int from, int to, int m, int k, std::size_t i) {
    return input<T>(from, i, comm::reduce_kind::sum, input_mode::general,
                    static_cast<std::uint64_t>(1000 * to + 10 * m + k) + count);
  };
  std::vector<std::vector<T>> out_next(messages);
  std::vector<std::vector<T>> out_prev(messages);
  std::vector<padded<T, memory_for<C>>> in_prev;
  std::vector<padded<T, memory_for<C>>> in_next;
  for (int m = 0; m < messages; ++m) {
    for (std::size_t i = 0; i < count; ++i) {
      out_next[static_cast<std::size_t>(m)].push_back(value(r, next, m, 0, i));
      out_prev[static_cast<std::size_t>(m)].push_back(value(r, prev, m, 1, i));
    }
    in_prev.emplace_back(count, m % 2 == 0);
    in_next.emplace_back(count, m % 2 == 1);
  }
  std::vector<comm::work> pending;
  // Receives first on odd ranks, sends first on even ones: both orders must work. Every rank
  // posts, per m, the stream-0 half before the stream-1 half, so even when prev == next (n <= 2)
  // the FIFO order per pair puts stream 0 into in_prev[m] and stream 1 into in_next[m].
  auto post_recvs = [&] {
    for (int m = 0; m < messages; ++m) {
      pending.push_back(c.irecv(in_prev[static_cast<std::size_t>(m)].view(), prev));
      pending.push_back(c.irecv(in_next[static_cast<std::size_t>(m)].view(), next));
    }
  };
  auto post_sends = [&] {
    for (int m = 0; m < messages; ++m) {
      pending.push_back(
          c.isend(make_view<C>(std::span<T const>(out_next[static_cast<std::size_t>(m)])), next));
      pending.push_back(
          c.isend(make_view<C>(std::span<T const>(out_prev[static_cast<std::size_t>(m)])), prev));
    }
  };
  if (r % 2 == 1) {
    post_recvs();
    post_sends();
  } else {
    post_sends();
    post_recvs();
  }
  for (auto& w : pending) w.wait();
  for (int m = 0; m < messages; ++m) {
    std::vector<T> want_prev;
    std::vector<T> want_next;
    for (std::size_t i = 0; i < count; ++i) {
      want_prev.push_back(value(prev, r, m, 0, i));
      want_next.push_back(value(next, r, m, 1, i));
    }
    std::string const tagm =
        " dtype " + std::string(name(dtype_of<T>)) + " message " + std::to_string(m);
    same_bits<T>(in_prev[static_cast<std::size_t>(m)].span, want_prev,
                 where(c, "irecv from prev", count, tagm));
    same_bits<T>(in_next[static_cast<std::size_t>(m)].span, want_next,
                 where(c, "irecv from next", count, tagm));
  }
  // Blocking pairs: even ranks send then receive, odd ranks receive then send.
  int const partner = r ^ 1;
  if (partner < n) {
    std::vector<T> mine;
    for (std::size_t i = 0; i < count; ++i) mine.push_back(value(r, partner, 7, 0, i));
    padded<T, memory_for<C>> got(count, true);
    if (r % 2 == 0) {
      c.send(make_view<C>(std::span<T const>(mine)), partner).wait();
      c.recv(got.view(), partner).wait();
    } else {
      c.recv(got.view(), partner).wait();
      c.send(make_view<C>(std::span<T const>(mine)), partner).wait();
    }
    std::vector<T> want;
    for (std::size_t i = 0; i < count; ++i) want.push_back(value(partner, r, 7, 0, i));
    same_bits<T>(got.span, want,
                 where(c, "send/recv pair", count, " dtype " + std::string(name(dtype_of<T>))));
  }
  // To oneself, where the rule allows it (self_messages_allowed; the fault suite checks the
  // rejection otherwise): post the send first (non-blocking), then receive.
  if constexpr (self_messages_allowed) {
    std::vector<T> mine;
    for (std::size_t i = 0; i < count; ++i) mine.push_back(value(r, r, 9, 0, i));
    padded<T, memory_for<C>> got(count, false);
    auto w = c.isend(make_view<C>(std::span<T const>(mine)), r);
    c.recv(got.view(), r).wait();
    w.wait();
    same_bits<T>(got.span, mine,
                 where(c, "send/recv to self", count, " dtype " + std::string(name(dtype_of<T>))));
  }
}

//! barrier: nobody leaves before the last rank arrives (rank 0 arrives `delay` late). Every
//! rank's departure time is compared with rank 0's arrival time (broadcast afterwards), so a
//! rank that is descheduled around the barrier cannot make the check flaky. The clock is
//! steady_clock, which is system-wide: ranks must share one machine.
template <comm::Communicator C>
void check_barrier(C& c, std::chrono::milliseconds delay = std::chrono::milliseconds(30)) {
  c.barrier().wait();  // line up
  if (c.rank() == 0) std::this_thread::sleep_for(delay);
  auto const arrived = std::chrono::steady_clock::now();
  c.barrier().wait();
  auto const left = std::chrono::steady_clock::now();
  std::int64_t rank0_arrived = arrived.time_since_epoch().count();
  auto const b = make_view<C>(std::span<std::int64_t>(&rank0_arrived, 1));
  c.broadcast(b, b, 0).wait();
  CHECK_MESSAGE(left.time_since_epoch().count() >= rank0_arrived,
                "barrier rank " << c.rank() << "/" << c.size() << " left "
                                << (rank0_arrived - left.time_since_epoch().count())
                                << " clock ticks before rank 0 arrived");
}

// ---- suites ---------------------------------------------------------------------------------

//! all_reduce, reduce, reduce_scatter, reduce_scatter_v: every op, every count, in-place and
//! out-of-place; every root for reduce.
template <Element T, comm::Communicator C>
void reductions(C& c, config const& cfg = {}) {
  int const n = c.size();
  for (auto kind : all_reduce_kinds)
    for (std::size_t count : cfg.counts)
      for (bool in_place : {false, true}) {
        check_all_reduce<T>(c, count, kind, in_place, cfg.mode);
        check_reduce_scatter<T>(c, count, kind, in_place, cfg.mode);
      }
  for (auto kind : all_reduce_kinds)
    for (int root = 0; root < n; ++root)
      check_reduce<T>(c, cfg.rooted_count, kind, root, root % 2 == 0, cfg.mode);
  for (std::size_t count : cfg.counts) {
    check_reduce<T>(c, count, comm::reduce_kind::sum, n - 1, false, cfg.mode);
    check_reduce<T>(c, count, comm::reduce_kind::sum, 0, true, cfg.mode);
  }
  for (std::size_t salt = 0; salt < 3; ++salt)
    for (auto kind : all_reduce_kinds)
      check_reduce_scatter_v<T>(c, uneven_counts(n, salt), kind, salt % 2 == 1, cfg.mode);
  check_reduce_scatter_v<T>(c, std::vector<std::size_t>(static_cast<std::size_t>(n), 0),
                            comm::reduce_kind::sum, false, cfg.mode);
}

//! broadcast, all_gather(_v), all_to_all(_v), gather, scatter: every count, every root,
//! in-place and out-of-place, uneven and zero _v counts.
template <Element T, comm::Communicator C>
void data_movement(C& c, config const& cfg = {}) {
  int const n = c.size();
  for (std::size_t count : cfg.counts)
    for (bool in_place : {false, true}) {
      check_all_gather<T>(c, count, in_place);
      check_all_to_all<T>(c, count, in_place);
      check_broadcast<T>(c, count, n - 1, in_place);
      check_gather<T>(c, count, 0, in_place);
      check_scatter<T>(c, count, n - 1, in_place);
    }
  for (int root = 0; root < n; ++root)
    for (bool in_place : {false, true}) {
      check_broadcast<T>(c, cfg.rooted_count, root, in_place);
      check_gather<T>(c, cfg.rooted_count, root, in_place);
      check_scatter<T>(c, cfg.rooted_count, root, in_place);
    }
  for (std::size_t salt = 0; salt < 4; ++salt)
    for (bool in_place : {false, true}) {
      check_all_gather_v<T>(c, uneven_counts(n, salt), in_place);
      check_all_to_all_v<T>(c, salt, in_place);
    }
  check_all_gather_v<T>(c, std::vector<std::size_t>(static_cast<std::size_t>(n), 0), false);
}

template <Element T, comm::Communicator C>
void point_to_point(C& c, config const& cfg = {}) {
  for (std::size_t count : cfg.counts) check_send_recv<T>(c, count);
}

}  // namespace weft::test::conformance
