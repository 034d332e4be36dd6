// weft/comm/detail/buffers.hpp — the pointer arithmetic every backend does on type-erased buffers:
// byte offsets of elements, whether two buffers overlap, and the exclusive sums that place the
// blocks of a `_v` collective.
#pragma once

#include <weft/comm/concepts.hpp>
#include <weft/core/dtype.hpp>

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace weft::comm::detail {

inline std::byte* bytes_of(void* p) noexcept { return static_cast<std::byte*>(p); }

//! `p` advanced by `elements` elements of `t` (nullptr stays nullptr: a non-root's absent buffer).
inline std::byte* byte_offset(void const* p, std::size_t elements, dtype t) noexcept {
  if (p == nullptr) return nullptr;
  return static_cast<std::byte*>(const_cast<void*>(p)) + elements * size_of(t);
}

//! Whether the bytes of two non-empty buffers share an address (empty buffers overlap nothing).
inline bool overlap(buffer_view const& a, buffer_view const& b) noexcept {
  if (a.count == 0 || b.count == 0) return false;
  auto const a0 = reinterpret_cast<std::uintptr_t>(a.data);
  auto const b0 = reinterpret_cast<std::uintptr_t>(b.data);
  return a0 < b0 + b.bytes() && b0 < a0 + a.bytes();
}

//! off[0] = 0, off[i + 1] = counts[0] + ... + counts[i], unchecked: for counts a plan has already
//! summed with checked_offsets.
inline std::vector<std::size_t> exclusive_sums(std::span<std::size_t const> counts) {
  std::vector<std::size_t> off(counts.size() + 1, 0);
  for (std::size_t i = 0; i < counts.size(); ++i) off[i + 1] = off[i] + counts[i];
  return off;
}

}  // namespace weft::comm::detail
