// weft/core/tensor/print.hpp — the numpy-style printer: print_options, to_string and
// operator<< for views and owning tensors. Kept apart (as CuTe's util/print_tensor.hpp) so that
// code that only passes tensors around does not pay for <ostream>, <charconv> and <vector>.
#pragma once

#include <weft/core/algorithm/copy.hpp>  // weft::copy, to stage device views on the host
#include <weft/core/config.hpp>
#include <weft/core/dtype.hpp>  // Element, dtype_of, name
#include <weft/core/error.hpp>  // detail::concat
#include <weft/core/memory.hpp>
#include <weft/core/tensor/owning.hpp>  // tensor, make_tensor
#include <weft/core/tensor/view.hpp>    // Tensor, shape_string, is_contiguous

#include <array>
#include <charconv>
#include <cstddef>
#include <ostream>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace weft {

// ---- printing -------------------------------------------------------------------------------

//! Printer settings, as numpy's: tensors with more than `threshold` elements show only the first
//! and last `edge_items` entries of each dimension, with "..." between.
struct print_options {
  index_t threshold = 1000;
  index_t edge_items = 3;
};

namespace detail {

template <class T>
constexpr std::string_view element_name() {
  using U = std::remove_cv_t<T>;
  if constexpr (Element<U>)
    return name(dtype_of<U>);  // f32, f64, bf16, f16, i32, i64, u8
  else if constexpr (std::is_same_v<U, bool>)
    return "bool";
  else if constexpr (std::is_integral_v<U> && std::is_signed_v<U>) {
    if constexpr (sizeof(U) == 1)
      return "i8";
    else if constexpr (sizeof(U) == 2)
      return "i16";
    else if constexpr (sizeof(U) == 4)
      return "i32";
    else
      return "i64";
  } else if constexpr (std::is_integral_v<U>) {
    if constexpr (sizeof(U) == 1)
      return "u8";
    else if constexpr (sizeof(U) == 2)
      return "u16";
    else if constexpr (sizeof(U) == 4)
      return "u32";
    else
      return "u64";
  } else {
    return "?";
  }
}

template <class T>
std::string format_element(T const& x) {
  char buf[64];
  if constexpr (std::is_same_v<T, bool>) {
    return x ? "true" : "false";
  } else if constexpr (std::is_integral_v<T>) {
    auto const r = std::is_signed_v<T>
                       ? std::to_chars(buf, buf + sizeof buf, static_cast<long long>(x))
                       : std::to_chars(buf, buf + sizeof buf, static_cast<unsigned long long>(x));
    return std::string(buf, r.ptr);
  } else if constexpr (std::is_floating_point_v<T>) {
    // Shortest text that reads back to the same value: 0.1f prints "0.1", 3.0 prints "3".
    auto const r = std::to_chars(buf, buf + sizeof buf, x);
    return std::string(buf, r.ptr);
  } else if constexpr (requires { static_cast<float>(x); }) {
    // bf16, f16 and other storage types print the float they decode to.
    auto const r = std::to_chars(buf, buf + sizeof buf, static_cast<float>(x));
    return std::string(buf, r.ptr);
  } else {
    return "?";
  }
}

template <class V>
std::string header(V const& v) {
  return concat("tensor<", element_name<typename V::value_type>(), ">", shape_string(v), " ",
                memory_space_t<V>::name);
}

// Host-accessible views only. Two passes over the same order: format the shown elements (to pad
// them to one width), then emit brackets and separators numpy-style.
template <class V>
std::string format_host(V const& v, print_options const& opt) {
  constexpr std::size_t R = V::rank();
  if (R > 0 && v.size() == 0) return "[]";  // numpy prints any empty array so
  auto const ext = extents_of(v);
  auto const str = strides_of(v);
  bool const summarise = static_cast<index_t>(v.size()) > opt.threshold;
  std::array<std::vector<index_t>, R> shown{};  // -1 stands for "..."
  for (std::size_t k = 0; k != R; ++k) {
    index_t const edge = opt.edge_items < 0 ? 0 : opt.edge_items;
    if (summarise && ext[k] > 2 * edge) {
      for (index_t i = 0; i < edge; ++i) shown[k].push_back(i);
      shown[k].push_back(-1);
      for (index_t i = ext[k] - edge; i < ext[k]; ++i) shown[k].push_back(i);
    } else {
      for (index_t i = 0; i < ext[k]; ++i) shown[k].push_back(i);
    }
  }
  auto const* const p = v.data_handle();
  std::vector<std::string> items;
  auto collect = [&](auto&& self, std::size_t depth, index_t offset) -> void {
    if (depth == R) {
      items.push_back(format_element(static_cast<typename V::value_type>(p[offset])));
      return;
    }
    for (index_t i : shown[depth])
      if (i >= 0) self(self, depth + 1, offset + i * str[depth]);
  };
  collect(collect, 0, 0);
  std::size_t width = 0;
  for (auto const& s : items) width = s.size() > width ? s.size() : width;

  std::string out;
  std::size_t next = 0;
  auto emit = [&](auto&& self, std::size_t depth) -> void {
    if (depth == R) {
      out.append(width - items[next].size(), ' ');
      out += items[next++];
      return;
    }
    out += '[';
    bool first = true;
    for (index_t i : shown[depth]) {
      if (!first) {
        if (depth + 1 == R) {
          out += ", ";
        } else {
          out += ',';
          out.append(R - 1 - depth, '\n');
          out.append(depth + 1, ' ');
        }
      }
      first = false;
      if (i < 0) {
        out += "...";
      } else {
        self(self, depth + 1);
      }
    }
    out += ']';
  };
  emit(emit, 0);
  return out;
}

}  // namespace detail

//! "tensor<f32>[2, 3] host\n[[1, 2, 3],\n [4, 5, 6]]": element type, extents, memory space, then
//! the values numpy-style (right-aligned to a common width; large tensors summarised with ...).
//! Device views are copied to the host first when they are contiguous and the CUDA runtime is
//! available; otherwise only the header is printed.
template <Tensor V>
[[nodiscard]] std::string to_string(V const& v, print_options const& options = {}) {
  std::string out = detail::header(v);
  out += '\n';
  if constexpr (memory_space_t<V>::host_accessible) {
    out += detail::format_host(v, options);
  } else {
#if WEFT_HAS_CUDA_RUNTIME
    if (is_contiguous(v)) {
      auto staging = make_tensor<typename V::value_type>(v.extents());
      weft::copy(staging.view(), v);
      out += detail::format_host(staging.view(), options);
      return out;
    }
    out += "<non-contiguous view in ";
    out += memory_space_t<V>::name;
    out += " memory: copy it to the host to print its values>";
#else
    out += "<";
    out += memory_space_t<V>::name;
    out += " memory: printing its values needs the CUDA runtime (weft::cuda)>";
#endif
  }
  return out;
}

//! Streams to_string(v). Found by ADL through the view's weft::space_accessor.
template <Tensor V>
std::ostream& operator<<(std::ostream& os, V const& v) {
  return os << to_string(v);
}

template <class T, std::size_t Rank, MemorySpace Space>
[[nodiscard]] std::string to_string(tensor<T, Rank, Space> const& t,
                                    print_options const& options = {}) {
  return to_string(t.view(), options);
}

template <class T, std::size_t Rank, MemorySpace Space>
std::ostream& operator<<(std::ostream& os, tensor<T, Rank, Space> const& t) {
  return os << to_string(t.view());
}

}  // namespace weft
