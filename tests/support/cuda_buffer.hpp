// tests/support/cuda_buffer.hpp — what the CUDA twins of the tests share: whether a device
// answers (the twins skip their kernel comparisons where none does) and a device buffer that owns
// n elements, filled from the host or zeroed, and read back as T or as doubles. nvcc only.
#pragma once

#if defined(__CUDACC__) && WEFT_HAS_CUDA_RUNTIME

#include <weft/core/error.hpp>
#include <weft/core/tensor.hpp>

#include <doctest/doctest.h>

#include <cuda_runtime_api.h>

#include <cstddef>
#include <vector>

namespace weft::test {

//! True when a CUDA device answers.
inline bool cuda_device_present() {
  int devices = 0;
  return cudaGetDeviceCount(&devices) == cudaSuccess && devices > 0;
}

//! True when a CUDA device answers; otherwise says so (MESSAGE) and returns false.
inline bool have_cuda_device() {
  if (!cuda_device_present()) {
    MESSAGE("no CUDA device: kernel comparison skipped");
    return false;
  }
  return true;
}

//! n elements of device memory (nullptr for n = 0), freed on scope exit.
template <class T>
struct device_buffer {
  T* p = nullptr;
  std::size_t n = 0;

  //! n zeroed elements.
  explicit device_buffer(std::size_t count) : n(count) {
    if (n == 0) return;
    WEFT_CUDA_TRY(cudaMalloc(reinterpret_cast<void**>(&p), n * sizeof(T)));
    WEFT_CUDA_TRY(cudaMemset(p, 0, n * sizeof(T)));
  }
  //! A copy of src[0, count).
  device_buffer(T const* src, std::size_t count) : device_buffer(count) { upload(src); }
  explicit device_buffer(std::vector<T> const& v) : device_buffer(v.data(), v.size()) {}
  template <std::size_t R>
  explicit device_buffer(weft::tensor<T, R> const& t) : device_buffer(t.data(), t.size()) {}
  device_buffer(device_buffer const&) = delete;
  device_buffer& operator=(device_buffer const&) = delete;
  ~device_buffer() {
    if (p != nullptr) cudaFree(p);
  }

  //! Overwrites the n elements with src[0, n).
  void upload(T const* src) {
    if (n > 0) WEFT_CUDA_TRY(cudaMemcpy(p, src, n * sizeof(T), cudaMemcpyHostToDevice));
  }
  void upload(std::vector<T> const& v) { upload(v.data()); }
  //! The n elements, copied back.
  [[nodiscard]] std::vector<T> host() const {
    std::vector<T> v(n);
    if (n > 0) WEFT_CUDA_TRY(cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
    return v;
  }
  //! The n elements, copied back and widened to double (for tests/support/approx.hpp).
  [[nodiscard]] std::vector<double> values() const {
    auto const h = host();
    std::vector<double> v(n);
    for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<double>(h[i]);
    return v;
  }
};

}  // namespace weft::test

#endif  // __CUDACC__ && WEFT_HAS_CUDA_RUNTIME
