// weft/core/tensor.hpp — weft's tensor vocabulary, all of it: non-owning views (cuda::std::mdspan
// whose accessor carries the memory space) and the Tensor concepts, the owning
// `tensor<T, Rank, Space>`, sub-views, copy and fill, and a printer.
//
// This header is an umbrella (as cute/tensor.hpp). Include a narrower one when you need less:
//   weft/core/tensor/view.hpp        views, index_t, Tensor concepts, is_contiguous, shape_string
//   weft/core/tensor/owning.hpp      tensor<T, Rank, Space>, make_tensor
//   weft/core/tensor/subview.hpp     as_strided, slice, select, transpose, subview, reshape,
//   flatten weft/core/algorithm/copy.hpp     copy(dst, src) across spaces, copy(ex, dst, src)
//   weft/core/algorithm/fill.hpp     fill(v, x) on the host, fill(ex, v, x)
//   weft/core/tensor/print.hpp       print_options, to_string, operator<<
#pragma once

#include <weft/core/tensor/view.hpp>
#include <weft/core/tensor/owning.hpp>
#include <weft/core/tensor/subview.hpp>
#include <weft/core/algorithm/copy.hpp>
#include <weft/core/algorithm/fill.hpp>
#include <weft/core/tensor/print.hpp>
