// weft/nn/cuda/linear.cuh — the affine layer y = x·wᵀ + b (w [out, in], torch layout) on the GPU
// through cublasGemmEx, with nn/linear.hpp's semantics: the input gradient overwrites dx, the
// weight and bias gradients ACCUMULATE (dbias by a chunked column sum: detail/column_sums.cuh). f32
// and f64 in their own precision; bf16/f16 storage with f32 accumulation (CUBLAS_COMPUTE_32F), each
// output rounded once, as the CPU path.
#pragma once

#if !defined(__CUDACC__)
#error "weft/nn/cuda/linear.cuh holds CUDA kernels: include it only from .cu files compiled by nvcc"
#endif

#include <weft/core/config.hpp>
#include <weft/core/dtype.hpp>
#include <weft/core/error.hpp>
#include <weft/core/math.hpp>  // compute_t
#include <weft/nn/cuda/detail/column_sums.cuh>

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <type_traits>

#if !WEFT_HAS_CUDA_RUNTIME
#error "weft/nn/cuda/linear.cuh needs WEFT_HAS_CUDA_RUNTIME=1 (link weft::cuda and CUDA::cublas)"
#endif

namespace weft::nn::kernels {

namespace linear_detail {

inline void cublas_check(cublasStatus_t code, char const* expr, source_location where) {
  if (code == CUBLAS_STATUS_SUCCESS) return;
  throw backend_error(
      ::weft::detail::concat("cuBLAS call `", expr, "` failed: ", cublasGetStatusName(code), " (",
                             cublasGetStatusString(code), ")"),
      "cublas", static_cast<long long>(code), where);
}

#define WEFT_NN_CUBLAS_TRY(expr)                                  \
  ::weft::nn::kernels::linear_detail::cublas_check((expr), #expr, \
                                                   ::weft::source_location::current())

// cuBLAS's names for weft's element types and the compute type and scalar type it pairs them with.
template <class T>
struct gemm_types;
template <>
struct gemm_types<float> {
  static constexpr cudaDataType_t data = CUDA_R_32F;
  static constexpr cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
  using scalar = float;
};
template <>
struct gemm_types<double> {
  static constexpr cudaDataType_t data = CUDA_R_64F;
  static constexpr cublasComputeType_t compute = CUBLAS_COMPUTE_64F;
  using scalar = double;
};
template <>
struct gemm_types<bf16> {
  static constexpr cudaDataType_t data = CUDA_R_16BF;
  static constexpr cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
  using scalar = float;
};
template <>
struct gemm_types<f16> {
  static constexpr cudaDataType_t data = CUDA_R_16F;
  static constexpr cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
  using scalar = float;
};

// Column-major C[m, n] = alpha·op(A)·op(B) + beta·C (cuBLAS's convention); row-major weft
// matrices are their transposes, so each entry point below swaps operands.
template <class T>
void gemm(cublasHandle_t h, cudaStream_t stream, cublasOperation_t ta, cublasOperation_t tb,
          std::int64_t m, std::int64_t n, std::int64_t k, T const* a, std::int64_t lda, T const* b,
          std::int64_t ldb, double beta, T* c, std::int64_t ldc) {
  using G = gemm_types<T>;
  using S = typename G::scalar;
  S const one = S(1), bet = static_cast<S>(beta);
  auto const ld = [](std::int64_t v) { return static_cast<int>(v > 1 ? v : 1); };
  WEFT_NN_CUBLAS_TRY(cublasSetStream(h, stream));
  WEFT_NN_CUBLAS_TRY(cublasGemmEx(
      h, ta, tb, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), &one, a, G::data,
      ld(lda), b, G::data, ld(ldb), &bet, c, G::data, ld(ldc), G::compute, CUBLAS_GEMM_DEFAULT));
}

inline void check_dims(std::int64_t n, std::int64_t in, std::int64_t out) {
  constexpr std::int64_t int_max = 0x7fffffff;
  WEFT_EXPECTS(n >= 0 && n <= int_max, "n", "in [0, 2^31 - 1] (cuBLAS's int extents)", n);
  WEFT_EXPECTS(in >= 0 && in <= int_max, "in", "in [0, 2^31 - 1] (cuBLAS's int extents)", in);
  WEFT_EXPECTS(out >= 0 && out <= int_max, "out", "in [0, 2^31 - 1] (cuBLAS's int extents)", out);
}

template <class T>
inline constexpr bool is_linear_element_v = std::is_same_v<T, float> || std::is_same_v<T, double> ||
                                            std::is_same_v<T, bf16> || std::is_same_v<T, f16>;

}  // namespace linear_detail

//! y[i, j] = bias[j] (the forward's initial C, exact in T, so the GEMM's beta = 1 adds it before
//! its single rounding), or 0 without a bias.
template <class T>
__global__ void linear_bias_fill_kernel(T const* __restrict__ bias, T* __restrict__ y,
                                        std::int64_t rows, std::int64_t out) {
  std::int64_t const total = rows * out;
  std::int64_t const step = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += step)
    y[i] = bias != nullptr ? bias[i % out] : T(0.0f);
}

//! dbias[j] += Σ_rows dy[r, j]: the term of column_detail::column_sums.
template <class T>
struct linear_bias_grad_term {
  T const* dy;
  std::int64_t out;
  __device__ void operator()(std::int64_t r, std::int64_t j, compute_t<T> (&acc)[1]) const {
    acc[0] += static_cast<compute_t<T>>(dy[r * out + j]);
  }
};

// ---- launches: device pointers, rows contiguous; `handle` is bound to `stream` for the call ----

//! y = x·wᵀ + bias (overwrites y). x [n, in], w [out, in], bias [out] or null, y [n, out].
template <class T>
void linear_forward(cublasHandle_t handle, cudaStream_t stream, T const* x, T const* w,
                    T const* bias, T* y, std::int64_t n, std::int64_t in, std::int64_t out) {
  static_assert(linear_detail::is_linear_element_v<T>,
                "weft::nn::kernels::linear: elements must be float, double, bf16 or f16");
  linear_detail::check_dims(n, in, out);
  if (n == 0 || out == 0) return;
  bool const init = bias != nullptr || in == 0;
  if (init) {
    std::int64_t const blocks = (n * out + 255) / 256;
    linear_bias_fill_kernel<T>
        <<<static_cast<unsigned>(blocks < 65536 ? blocks : 65536), 256, 0, stream>>>(bias, y, n,
                                                                                     out);
    WEFT_CUDA_TRY(cudaGetLastError());
  }
  if (in == 0) return;
  // Column-major yᵀ [out, n] = w [out, in] (wᵀ stored, op T) · xᵀ [in, n].
  linear_detail::gemm<T>(handle, stream, CUBLAS_OP_T, CUBLAS_OP_N, out, n, in, w, in, x, in,
                         init ? 1.0 : 0.0, y, out);
}

//! dx = dy·w (overwrites dx). dy [n, out], w [out, in], dx [n, in].
template <class T>
void linear_backward_input(cublasHandle_t handle, cudaStream_t stream, T const* dy, T const* w,
                           T* dx, std::int64_t n, std::int64_t in, std::int64_t out) {
  static_assert(linear_detail::is_linear_element_v<T>,
                "weft::nn::kernels::linear: elements must be float, double, bf16 or f16");
  linear_detail::check_dims(n, in, out);
  if (n == 0 || in == 0) return;
  if (out == 0) {
    WEFT_CUDA_TRY(cudaMemsetAsync(dx, 0, static_cast<std::size_t>(n * in) * sizeof(T), stream));
    return;
  }
  // Column-major dxᵀ [in, n] = wᵀ [in, out] · dyᵀ [out, n].
  linear_detail::gemm<T>(handle, stream, CUBLAS_OP_N, CUBLAS_OP_N, in, n, out, w, in, dy, out, 0.0,
                         dx, in);
}

//! dw += dyᵀ·x and dbias += the column sums of dy (ACCUMULATE). dy [n, out], x [n, in],
//! dw [out, in], dbias [out] or null.
template <class T>
void linear_backward_weight(cublasHandle_t handle, cudaStream_t stream, T const* dy, T const* x,
                            T* dw, T* dbias, std::int64_t n, std::int64_t in, std::int64_t out) {
  static_assert(linear_detail::is_linear_element_v<T>,
                "weft::nn::kernels::linear: elements must be float, double, bf16 or f16");
  linear_detail::check_dims(n, in, out);
  if (n == 0 || out == 0) return;
  if (in > 0)  // column-major dwᵀ [in, out] += xᵀ [in, n] · dy [n, out]
    linear_detail::gemm<T>(handle, stream, CUBLAS_OP_N, CUBLAS_OP_T, in, out, n, x, in, dy, out,
                           1.0, dw, in);
  if (dbias != nullptr)
    column_detail::column_sums<1, T>(stream, linear_bias_grad_term<T>{dy, out},
                                     column_detail::outputs<T, 1>{{dbias}}, n, out);
}

}  // namespace weft::nn::kernels
