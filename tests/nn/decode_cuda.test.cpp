// CUDA twin of decode.test.cpp: nn::cuda_gpt_decoder<T> (weft/nn/cuda/decode.cuh) against
// nn::gpt_decoder<T> on the CPU, the tested reference (decode.test.cpp checks it against the full
// forward), driven by the same calls: a batch reset and stepped, prompts prefilled in one row each
// and forked into rows that continue different sources (a row that is both source and
// destination included), a second fork mid-generation (the last logits following their rows),
// MHA/GQA/MQA and two layers, f64 and f32; logits into host and into device memory, or kept
// (logits()); the parameters read at every step (an update between
// two generations is seen); the CPU decoder's refusals, before anything changes.
//
// Tolerances, against the largest logit of the run: f64 1e-10 (cuBLAS's and the CPU's summation
// orders, the device's exp: rounding of order 1e-15 through two layers); f32 1e-4 (the same in
// f32; the CPU decoder is within 1e-5 of the full forward in f32, decode.test.cpp). A missing or
// misplaced cache entry, a wrong fork source or position moves logits by O(1) of the largest.
#include <weft/nn/decode.hpp>
#include <weft/nn/gpt.hpp>

#include "nn_test.hpp"

#include <weft/core/config.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#if defined(__CUDACC__) && WEFT_HAS_CUDA_RUNTIME
#include <weft/nn/cuda/decode.cuh>

#include "support/cuda_buffer.hpp"

namespace {
namespace nn = weft::nn;
using weft::index_t;
using weft::test::have_cuda_device;
template <class T>
using dbuf = weft::test::device_buffer<T>;

nn::gpt_config twin_config(index_t heads, index_t kv_heads, index_t layers) {
  nn::gpt_config c;
  c.vocab = 14;
  c.context = 12;
  c.d_model = 16;
  c.heads = heads;
  c.kv_heads = kv_heads;
  c.layers = layers;
  return c;
}

// GPT-2's init scaled up so that attention is far from uniform (decode.test.cpp's).
template <class T>
nn::param_store<T> twin_params(nn::gpt_config const& c) {
  nn::param_store<T> s(nn::gpt_layout(c));
  nn::gpt_init(s, c, 5);
  for (std::size_t i = 0; i < s.params().size(); ++i)
    s.params()[i] = static_cast<T>(s.params()[i] * 10 + 0.01 * std::sin(0.3 * double(i)));
  return s;
}

// The decoder's last logits, copied back.
template <class T>
std::vector<T> logits_of(nn::cuda_gpt_decoder<T> const& d) {
  auto const l = d.logits();
  std::vector<T> h(static_cast<std::size_t>(l.extent(0) * l.extent(1)));
  WEFT_CUDA_TRY(cudaStreamSynchronize(d.executor().stream));
  WEFT_CUDA_TRY(
      cudaMemcpy(h.data(), l.data_handle(), h.size() * sizeof(T), cudaMemcpyDeviceToHost));
  return h;
}

// The two decoders driven by the same calls; every step's logits compared.
template <class T>
struct twin {
  nn::gpt_config c;
  nn::param_store<T> store;
  dbuf<T> device_params;
  nn::gpt_decoder<T> cpu;
  nn::cuda_gpt_decoder<T> gpu;
  double scale = 0, worst = 0;
  int steps = 0;

  twin(nn::gpt_config const& config, index_t max_rows, index_t max_len)
      : c(config),
        store(twin_params<T>(config)),
        device_params(store.params().data(), store.params().size()),
        cpu(c, store, max_rows, max_len),
        gpu(c, device_params.p, max_rows, max_len) {}

  void reset(index_t rows) {
    cpu.reset(rows);
    gpu.reset(rows);
  }
  void fork(std::vector<index_t> const& sources) {
    cpu.fork(sources);
    gpu.fork(sources);
    CHECK(gpu.rows() == cpu.rows());
    CHECK(gpu.length() == cpu.length());
  }
  // One step of both; `on_device`: the GPU's logits into device memory, then copied back;
  // `kept`: the GPU step without an output, its logits() read back.
  void step(std::vector<std::int32_t> const& tokens, bool on_device = false, bool kept = false) {
    auto const rows = static_cast<index_t>(tokens.size());
    std::vector<T> want(static_cast<std::size_t>(rows * c.vocab), T(0));
    std::vector<T> got(want.size(), T(-7));
    cpu.step(tokens, weft::tensor_view<T, 2>(want.data(), rows, c.vocab));
    if (kept) {
      gpu.step(tokens);
      got = logits_of(gpu);
    } else if (on_device) {
      dbuf<T> d(want.size());
      gpu.step(tokens, weft::tensor_view<T, 2, weft::cuda_space>(d.p, rows, c.vocab));
      got = d.host();
    } else {
      gpu.step(tokens, weft::tensor_view<T, 2>(got.data(), rows, c.vocab));
    }
    CHECK(gpu.length() == cpu.length());
    for (std::size_t k = 0; k < want.size(); ++k) {
      scale = std::max(scale, std::abs(static_cast<double>(want[k])));
      double const d = std::isfinite(static_cast<double>(got[k]))
                           ? std::abs(static_cast<double>(got[k]) - static_cast<double>(want[k]))
                           : INFINITY;
      worst = std::max(worst, d);
    }
    ++steps;
  }
  void expect(double tol, std::string const& what) const {
    INFO(what << ": " << steps << " steps, largest logit " << scale << ", largest difference "
              << worst);
    CHECK(scale > 1.0);  // the model is not trivial
    CHECK(worst <= tol * scale);
  }
};

template <class T>
void check_generation(index_t heads, index_t kv_heads, index_t layers, double tol) {
  std::string const what = std::string(sizeof(T) == 8 ? "f64" : "f32") + ", heads " +
                           std::to_string(heads) + "/" + std::to_string(kv_heads) + ", layers " +
                           std::to_string(layers);
  twin<T> t(twin_config(heads, kv_heads, layers), 4, 10);
  // A stale batch first: after reset its positions are not read.
  t.reset(4);
  t.step({1, 2, 3, 4});
  t.step({5, 6, 7, 8}, true);
  // Two prompts of 4 tokens prefilled in rows 0 and 1, forked into 4 rows (row 1 continues
  // prompt 0, row 0 prompt 1: both source and destination).
  t.reset(2);
  std::vector<std::vector<std::int32_t>> const prompts{{3, 7, 10, 1}, {5, 2, 11, 0}};
  for (std::size_t i = 0; i < 4; ++i) t.step({prompts[0][i], prompts[1][i]}, i == 2);
  t.fork({1, 0, 1, 0});
  for (int i = 0; i < 3; ++i)
    t.step({static_cast<std::int32_t>(i), static_cast<std::int32_t>(2 * i + 1),
            static_cast<std::int32_t>(13 - i), static_cast<std::int32_t>(9)},
           i == 1);
  // Mid-generation: three rows continuing rows {3, 3, 0} of seven cached positions, with the
  // last step's logits (logits(): row r holds its source's).
  auto const before = logits_of(t.gpu);
  t.fork({3, 3, 0});
  auto const after = logits_of(t.gpu);
  auto const v = static_cast<std::size_t>(t.c.vocab);
  for (std::size_t r = 0; r < 3; ++r) {
    std::size_t const src = r < 2 ? 3 : 0;
    CHECK(std::equal(after.begin() + static_cast<std::ptrdiff_t>(r * v),
                     after.begin() + static_cast<std::ptrdiff_t>((r + 1) * v),
                     before.begin() + static_cast<std::ptrdiff_t>(src * v)));
  }
  for (int i = 0; i < 3; ++i)
    t.step({static_cast<std::int32_t>(4 + i), 12, static_cast<std::int32_t>(i)}, false, i != 1);
  CHECK(t.gpu.length() == 10);
  t.expect(tol, what);
}

}  // namespace

TEST_CASE("nn/cuda: cuda_gpt_decoder gives nn::gpt_decoder's logits at every step") {
  if (!have_cuda_device()) return;
  check_generation<double>(4, 0, 2, 1e-10);
  check_generation<double>(4, 2, 2, 1e-10);
  check_generation<double>(4, 1, 1, 1e-10);
  check_generation<float>(4, 0, 2, 1e-4);
  check_generation<float>(4, 2, 1, 1e-4);
  check_generation<float>(4, 1, 1, 1e-4);  // MQA
}

TEST_CASE("nn/cuda: cuda_gpt_decoder forks an empty cache into more rows") {
  if (!have_cuda_device()) return;
  twin<double> t(twin_config(4, 2, 2), 3, 4);
  t.reset(2);
  t.fork({1, 1, 0});  // nothing cached yet: only the row count changes
  t.step({3, 4, 5}, true);
  t.step({6, 7, 8});
  t.expect(1e-10, "fork before the first step");
}

TEST_CASE("nn/cuda: cuda_gpt_decoder reads the parameters at every step, refuses bad arguments") {
  if (!have_cuda_device()) return;
  twin<double> t(twin_config(4, 0, 2), 2, 4);
  t.reset(2);
  t.step({2, 5});
  // An optimizer step between two generations, on both sides.
  for (auto& p : t.store.params()) p *= 1.5;
  t.device_params.upload(t.store.params().data());
  t.reset(2);
  t.step({2, 5});
  t.expect(1e-10, "after a parameter update");

  auto& dec = t.gpu;
  std::vector<double> logits(2 * 14);
  weft::tensor_view<double, 2> lv(logits.data(), 2, 14);
  index_t const len = dec.length();
  nn_test::expect_throw<weft::invalid_argument_error>([&] { dec.reset(3); }, "max_rows");
  std::vector<std::int32_t> bad{2, 14};
  nn_test::expect_throw<weft::invalid_argument_error>([&] { dec.step(bad, lv); }, "tokens[1]");
  std::vector<std::int32_t> three{1, 2, 3};
  nn_test::expect_throw<weft::shape_error>([&] { dec.step(three, lv); }, "one per row");
  std::vector<std::int32_t> two{1, 2};
  weft::tensor_view<double, 2> wrong(logits.data(), 2, 13);
  nn_test::expect_throw<weft::shape_error>([&] { dec.step(two, wrong); }, "logits");
  std::vector<index_t> const bad_source{0, 2};
  nn_test::expect_throw<weft::invalid_argument_error>([&] { dec.fork(bad_source); }, "sources[1]");
  CHECK(dec.length() == len);  // nothing changed
  CHECK(dec.rows() == 2);
  nn_test::expect_throw<weft::invalid_argument_error>(
      [&] { nn::cuda_gpt_decoder<double>(t.c, t.device_params.p, 1, 13); }, "context");
  nn_test::expect_throw<weft::invalid_argument_error>(
      [&] { nn::cuda_gpt_decoder<double>(t.c, nullptr, 1, 4); }, "params");
  std::vector<index_t> const none, too_many{0, 0, 0};
  nn_test::expect_throw<weft::invalid_argument_error>([&] { dec.fork(none); }, "sources.size()");
  nn_test::expect_throw<weft::invalid_argument_error>([&] { dec.fork(too_many); }, "max_rows");
  {
    nn::cuda_gpt_decoder<double> fresh(t.c, t.device_params.p, 2, 4);
    nn_test::expect_throw<weft::invalid_argument_error>([&] { fresh.step(two, lv); }, "reset");
  }
  // A full cache is refused.
  t.step({1, 1});
  t.step({1, 1});
  t.step({1, 1});
  CHECK(dec.length() == 4);
  nn_test::expect_throw<weft::invalid_argument_error>([&] { dec.step(two, lv); }, "max_len");
  t.expect(1e-10, "to a full cache");
}

#endif
