// CUDA twin of the nn gpt tests: the packed causal attention (weft/nn/cuda/attention.cuh) against
// nn::causal_attention_*, and nn::cuda_gpt<float> (weft/nn/cuda/gpt.cuh) against nn::gpt<float>
// on the CPU, the tested reference: loss and every parameter's gradient over a grid of small
// models (MHA, GQA, MQA; 1 and 2 layers; packed documents, an empty one and a one-token one;
// ignored targets; the mean and an explicit token weight; two accumulated microbatches; a token
// loss in place of the cross-entropy, against two accumulated weighted passes), a few
// fused-AdamW steps of the device buffers against optim::adamw<float>, the input checks (a
// refused batch leaves the last forward intact), and nn::cuda_gpt<double> against nn::gpt<double>
// (bounds near f64's rounding, its own comment). The host build compiles nothing here.
//
// Tolerances. Both sides compute in f32 and differ by summation order (cuBLAS's blocking, CUB
// block trees, the attention's per-row loops against the CPU's tiles), FMA contraction and, in the
// loss, the SFU's exponentials (rl/cuda/logprobs.cuh: ex2.approx and __expf, a few ulp, so about
// 1e-6 relative on a dlogit). The bounds are nn::gpt's own f32-against-f64 ones (gpt.test.cpp):
//   loss: 1e-5 relative;
//   gradients, per parameter: max|gpu − cpu| <= 1e-4 · max(max|cpu| of that parameter,
//     1e-2 · max|cpu| over all parameters).
// On these cases the CPU's f32 model is within 7e-8 (loss) and 6.5e-6 (that per-parameter
// measure) of its f64 model; GPU and CPU each so close to f64, plus the SFU's 1e-6, stay inside.
// The floor is for k.b, whose exact gradient is 0 (softmax is invariant to a shift of a query's
// scores, and k.b shifts them all by q·b; Σ_j dS_ij = 0 whatever dO is): both sides hold rounding
// noise there, of the order of u = 2^-24 times the terms that cancel.
// AdamW: the device step of the device gradients equals optim::adamw<float> fed the same
// gradients within 1e-6 · max(|θ|, 1) (the fused kernel's FMA contraction, adamw_cuda.test.cpp).
// Against the whole CPU path (its own gradients) Adam's update lr·m̂/(sqrt(v̂) + ε) amplifies
// gradient rounding where |g| is near the rounding itself (k.b above) up to a different sign, so
// that comparison checks the losses (1e-5 relative per step), that no element moved further apart
// than Adam's per-step bound allows (2 · 3.2·lr per step: |m̂|/sqrt(v̂) <= (1 − β1)/sqrt(1 − β2)
// ≈ 3.2), and that at most 1 % of the elements differ by more than 1e-2·lr (f32 against f64 on
// the CPU, 3 steps of this case: the 16 elements of k.b, 0.23 %).
#include <weft/nn/gpt.hpp>
#include <weft/optim/adamw.hpp>

#include "nn_test.hpp"

#include <weft/core/config.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#if defined(__CUDACC__) && WEFT_HAS_CUDA_RUNTIME
#include <weft/nn/cuda/gpt.cuh>
#include <weft/optim/cuda/adamw.cuh>

#include "support/cuda_buffer.hpp"

#include <cuda_runtime_api.h>

namespace {
using weft::index_t;
namespace nn = weft::nn;
namespace optim = weft::optim;
namespace nk = weft::nn::kernels;

using weft::test::have_cuda_device;
template <class T>
using dbuf = weft::test::device_buffer<T>;

// Packed documents of the given lengths: tokens from a fixed pattern, per-document positions,
// next-token targets (-1 at each document's last row and at every row r ≡ 2 mod 5).
struct twin_batch {
  std::vector<std::int32_t> tokens, positions, targets;
  std::vector<std::int64_t> cu{0};
  twin_batch(std::vector<index_t> const& lengths, index_t vocab, int seed) {
    for (std::size_t n = 0; n < lengths.size(); ++n) {
      auto const first = static_cast<index_t>(tokens.size());
      for (index_t i = 0; i < lengths[n]; ++i) {
        auto const r = static_cast<index_t>(tokens.size());
        tokens.push_back(
            static_cast<std::int32_t>((7 * r + 3 * static_cast<index_t>(n) + seed) % vocab));
        positions.push_back(static_cast<std::int32_t>(i));
      }
      for (index_t i = 0; i < lengths[n]; ++i) {
        auto const r = static_cast<std::size_t>(first + i);
        bool const last = i + 1 == lengths[n];
        targets.push_back(last || r % 5 == 2 ? -1 : tokens[r + 1]);
      }
      cu.push_back(static_cast<std::int64_t>(tokens.size()));
    }
  }
  [[nodiscard]] nn::gpt_batch view() const { return {tokens, positions, targets, cu}; }
};

// GPT-2's initialisation in f64, scaled up and jittered (as gpt.test.cpp) so that every path
// carries a gradient, rounded to T.
template <class T = float>
nn::param_store<T> make_twin_store(nn::gpt_config const& c, double scale_up) {
  nn::param_store<double> s(nn::gpt_layout(c));
  nn::gpt_init(s, c, 1234);
  nn::param_store<T> out(nn::gpt_layout(c));
  std::uint64_t k = 0;
  for (std::size_t i = 0; i < s.params().size(); ++i) {
    double const jitter = 0.05 * std::sin(0.7 * static_cast<double>(k++));
    out.params()[i] = static_cast<T>(s.params()[i] * scale_up + jitter);
  }
  return out;
}

constexpr double loss_tol = 1e-5;
constexpr double grad_tol = 1e-4;
constexpr double grad_floor = 1e-2;

void expect_loss(double gpu, double cpu, std::string const& what, double tol = loss_tol) {
  double const err = std::abs(gpu - cpu) / std::max(std::abs(cpu), 1e-30);
  INFO(what << ": loss gpu " << gpu << " cpu " << cpu << ", relative error " << err);
  CHECK(std::isfinite(gpu));
  CHECK(err <= tol);
}

// Every parameter's gradient, normwise against max(its max|cpu|, grad_floor · the global one).
template <class T>
void expect_grads(nn::param_store<T>& gpu, nn::param_store<T>& cpu, std::string const& what,
                  double tol = grad_tol) {
  double global = 0;
  for (T g : cpu.grads()) global = std::max(global, std::abs(static_cast<double>(g)));
  CHECK_MESSAGE(global > 0, what << ": the CPU gradient is all zero");
  double worst = 0;
  std::string worst_name;
  for (auto const& e : cpu.layout().entries()) {
    auto const want = cpu.grad_span(e.name);
    auto const got = gpu.grad_span(e.name);
    double scale = grad_floor * global, err = 0;
    for (T w : want) scale = std::max(scale, std::abs(static_cast<double>(w)));
    std::size_t first_bad = want.size();
    for (std::size_t i = 0; i < want.size(); ++i) {
      double const d = std::isfinite(got[i])
                           ? std::abs(static_cast<double>(got[i]) - static_cast<double>(want[i]))
                           : INFINITY;
      if (d > tol * scale && first_bad == want.size()) first_bad = i;
      err = std::max(err, d / scale);
    }
    if (err > worst) {
      worst = err;
      worst_name = e.name;
    }
    INFO(what << ": gradient of " << e.name << " off by " << err << " of " << scale
              << (first_bad < want.size() ? " (first at " + std::to_string(first_bad) + ": gpu " +
                                                std::to_string(got[first_bad]) + " cpu " +
                                                std::to_string(want[first_bad]) + ")"
                                          : std::string()));
    CHECK(err <= tol);
  }
  MESSAGE(what << ": worst gradient error " << worst << " (" << worst_name << ")");
}

struct gpt_case {
  char const* name;
  nn::gpt_config config;
  std::vector<index_t> docs_a, docs_b;
  double weight_a, weight_b;  // token_weight of the two microbatches (0: the mean)
};

nn::gpt_config make_config(index_t vocab, index_t context, index_t d, index_t heads,
                           index_t kv_heads, index_t layers, index_t hidden) {
  nn::gpt_config c;
  c.vocab = vocab;
  c.context = context;
  c.d_model = d;
  c.heads = heads;
  c.kv_heads = kv_heads;
  c.layers = layers;
  c.mlp_hidden = hidden;
  return c;
}

std::vector<gpt_case> cases() {
  return {
      {"MHA, 1 layer", make_config(13, 12, 16, 2, 0, 1, 24), {5, 6, 9}, {12, 3}, 0.0, 0.05},
      {"GQA 4/2, 2 layers", make_config(17, 16, 16, 4, 2, 2, 0), {7, 1, 10, 4}, {16}, 0.03, 0.0},
      {"MQA 4/1, 2 layers, an empty document",
       make_config(29, 10, 32, 4, 1, 2, 40),
       {4, 0, 10, 1, 6},
       {9, 9},
       0.0,
       0.02},
      {"MHA, head_dim 1", make_config(7, 8, 3, 3, 0, 1, 5), {8, 2}, {1, 1, 1}, 0.1, 0.0},
  };
}

// A copy of `good` changed by `edit` must make forward throw E naming `name`.
template <class E, class Edit>
void refuse(nn::cuda_gpt<float>& gpu, twin_batch const& good, Edit edit, std::string const& name) {
  twin_batch data = good;
  edit(data);
  nn_test::expect_throw<E>([&] { (void)gpu.forward(data.view()); }, name);
}

}  // namespace

TEST_CASE("nn/cuda: packed causal GQA attention (f32) gives nn::causal_attention's results") {
  if (!have_cuda_device()) return;
  // (heads, kv_heads, head_dim, cu_seqlens): MHA, GQA with an empty and a one-token document,
  // MQA with head_dim 1, and one document longer than the CPU's 64 x 128 tiles.
  struct shape {
    index_t hq, hkv, d;
    std::vector<std::int64_t> cu;
  };
  for (auto const& sh : std::vector<shape>{{2, 2, 8, {0, 5, 11, 20}},
                                           {4, 2, 4, {0, 7, 7, 8, 18}},
                                           {3, 1, 1, {0, 6, 9}},
                                           {4, 1, 16, {0, 3, 150}}}) {
    index_t const t = sh.cu.back(), qw = sh.hq * sh.d, kw = sh.hkv * sh.d;
    CAPTURE(sh.hq);
    CAPTURE(sh.hkv);
    CAPTURE(sh.d);
    CAPTURE(t);
    auto const q = nn_test::random<float>(1, -1.5, 1.5, t, qw);
    auto const k = nn_test::random<float>(2, -1.5, 1.5, t, kw);
    auto const v = nn_test::random<float>(3, -1.5, 1.5, t, kw);
    auto const dout = nn_test::random<float>(4, -1.0, 1.0, t, qw);
    auto o = weft::make_tensor<float>(t, qw), dq = weft::make_tensor<float>(t, qw);
    auto dk = weft::make_tensor<float>(t, kw), dv = weft::make_tensor<float>(t, kw);
    auto lse = weft::make_tensor<float>(sh.hq, t);
    nn::attention_heads const heads{sh.hq, sh.hkv, sh.d, 0.0};
    std::span<std::int64_t const> const cu(sh.cu);
    nn::causal_attention_forward(q.view(), k.view(), v.view(), o.view(), lse.view(), cu, heads);
    nn::causal_attention_backward(q.view(), k.view(), v.view(), o.view(), lse.view(), dout.view(),
                                  dq.view(), dk.view(), dv.view(), cu, heads);

    auto up = [](auto const& h) {
      using E = std::remove_cvref_t<decltype(*h.data())>;
      auto d = std::make_unique<dbuf<E>>(h.size());
      WEFT_CUDA_TRY(cudaMemcpy(d->p, h.data(), h.size() * sizeof(E), cudaMemcpyHostToDevice));
      return d;
    };
    auto const dq_ = up(q), dk_ = up(k), dv_ = up(v), dg_ = up(dout);
    auto const dcu = up(sh.cu);
    dbuf<float> go(o.size()), gl(lse.size()), gdq(dq.size()), gdk(dk.size()), gdv(dv.size()),
        dsum(lse.size());
    auto const docs = static_cast<std::int64_t>(sh.cu.size()) - 1;
    nk::causal_attention_forward<float>(nullptr, dq_->p, dk_->p, dv_->p, go.p, gl.p, dcu->p, docs,
                                        t, heads);
    nk::causal_attention_backward<float>(nullptr, dq_->p, dk_->p, dv_->p, go.p, gl.p, dg_->p, gdq.p,
                                         gdk.p, gdv.p, dsum.p, dcu->p, docs, t, heads);
    WEFT_CUDA_TRY(cudaDeviceSynchronize());
    auto down = [](dbuf<float> const& d) {
      std::vector<float> h(d.n);
      WEFT_CUDA_TRY(cudaMemcpy(h.data(), d.p, d.n * sizeof(float), cudaMemcpyDeviceToHost));
      return std::vector<double>(h.begin(), h.end());
    };
    // f32 on both sides, the same row math; they differ by the order of the dot products and the
    // row sums (the CPU's BLAS tiles) and by FMA contraction: a few ulp of rows of at most 150.
    NN_CHECK_CLOSE(down(go), nn_test::values(o), 1e-5);
    NN_CHECK_CLOSE(down(gl), nn_test::values(lse), 1e-5);
    NN_CHECK_CLOSE(down(gdq), nn_test::values(dq), 1e-5);
    NN_CHECK_CLOSE(down(gdk), nn_test::values(dk), 1e-5);
    NN_CHECK_CLOSE(down(gdv), nn_test::values(dv), 1e-5);
  }
}

TEST_CASE("nn/cuda gpt: loss and every gradient equal nn::gpt<float>'s, two microbatches") {
  if (!have_cuda_device()) return;
  for (auto const& tc : cases()) {
    CAPTURE(tc.name);
    auto const& c = tc.config;
    twin_batch const a(tc.docs_a, c.vocab, 1), b(tc.docs_b, c.vocab, 5);
    auto cpu_store = make_twin_store(c, 4.0);
    nn::gpt<float> cpu(c, cpu_store);
    nn::cuda_gpt<float> gpu(c);
    gpu.upload_params(cpu_store);
    nn::param_store<float> got(nn::gpt_layout(c));

    double const la_cpu = cpu.forward(a.view(), tc.weight_a);
    double const la_gpu = gpu.forward(a.view(), tc.weight_a);
    expect_loss(la_gpu, la_cpu, std::string(tc.name) + ", microbatch 1");
    CHECK(gpu.tokens() == static_cast<index_t>(a.tokens.size()));
    cpu.backward();
    gpu.backward();
    gpu.download_grads(got);
    expect_grads(got, cpu_store, std::string(tc.name) + ", microbatch 1");

    // The second microbatch adds to the first's gradients on both sides.
    double const lb_cpu = cpu.forward(b.view(), tc.weight_b);
    double const lb_gpu = gpu.forward(b.view(), tc.weight_b);
    expect_loss(lb_gpu, lb_cpu, std::string(tc.name) + ", microbatch 2");
    cpu.backward();
    gpu.backward();
    gpu.download_grads(got);
    expect_grads(got, cpu_store, std::string(tc.name) + ", accumulated");

    // zero_grad clears the device buffer; the parameters went up and come back unchanged.
    gpu.zero_grad();
    gpu.download_grads(got);
    CHECK(std::all_of(got.grads().begin(), got.grads().end(), [](float g) { return g == 0.0f; }));
    gpu.download_params(got);
    CHECK(std::equal(got.params().begin(), got.params().end(), cpu_store.params().begin()));
  }
}

// cuda_gpt<double> (rl_trainer_cuda's --f64 model, which its --check compares with the CPU's)
// against nn::gpt<double>: both sides in f64 (attention, loss and reductions in double), differing
// only by summation order and FMA contraction, so the bounds are f32's scaled towards f64's
// rounding: the f32 case's bounds are about 170 and 1700 units of f32 rounding; here 1e-12 and
// 1e-11 are about 9e3 and 9e4 units of f64's (2^-53), and an f32 step anywhere in the f64 path (its
// rounding, 6e-8, enters the loss and gradients at 1e-8 or more) fails them by orders of magnitude.
TEST_CASE(
    "nn/cuda gpt: cuda_gpt<double> gives nn::gpt<double>'s loss and gradients to f64 rounding") {
  if (!have_cuda_device()) return;
  constexpr double loss_tol64 = 1e-12, grad_tol64 = 1e-11;
  for (auto const& tc : cases()) {
    CAPTURE(tc.name);
    auto const& c = tc.config;
    twin_batch const a(tc.docs_a, c.vocab, 1), b(tc.docs_b, c.vocab, 5);
    auto cpu_store = make_twin_store<double>(c, 4.0);
    nn::gpt<double> cpu(c, cpu_store);
    nn::cuda_gpt<double> gpu(c);
    gpu.upload_params(cpu_store);
    nn::param_store<double> got(nn::gpt_layout(c));
    for (int mb = 0; mb < 2; ++mb) {  // the second microbatch accumulates
      twin_batch const& x = mb == 0 ? a : b;
      double const w = mb == 0 ? tc.weight_a : tc.weight_b;
      std::string const what =
          std::string(tc.name) + (mb == 0 ? ", f64 microbatch 1" : ", f64 accumulated");
      double const l_cpu = cpu.forward(x.view(), w);
      double const l_gpu = gpu.forward(x.view(), w);
      expect_loss(l_gpu, l_cpu, what, loss_tol64);
      cpu.backward();
      gpu.backward();
      gpu.download_grads(got);
      expect_grads(got, cpu_store, what, grad_tol64);
    }
  }
}

TEST_CASE(
    "nn/cuda gpt: a token loss gets each row's log-prob, and its d loss / d logp seeds backward") {
  if (!have_cuda_device()) return;
  // The token loss −Σ w_k·logp_k with w = 0.07 on even rows and 0.02 on odd ones. The reference is
  // two cross-entropy passes of nn::gpt<float> accumulated: the even rows' targets alone at token
  // weight 0.07, then the odd rows' alone at 0.02. The hook also writes d loss / d logp = 1e3 on
  // the rows whose target is ignored, which backward must not propagate.
  double const w_even = 0.07, w_odd = 0.02;
  for (auto const& tc : cases()) {
    CAPTURE(tc.name);
    auto const& c = tc.config;
    twin_batch const a(tc.docs_a, c.vocab, 3);
    auto cpu_store = make_twin_store(c, 4.0);
    nn::gpt<float> cpu(c, cpu_store);
    nn::cuda_gpt<float> gpu(c);
    gpu.upload_params(cpu_store);

    // The rows' log p(target) from the CPU's logits, in double.
    (void)cpu.forward(a.view());
    float const* const logits = cpu.logits().data_handle();  // [tokens, vocab], row-major
    auto const at = [&](index_t r, index_t v) {
      return static_cast<double>(logits[r * c.vocab + v]);
    };
    std::vector<double> want_logp(a.targets.size(), 0.0);
    for (std::size_t k = 0; k < a.targets.size(); ++k) {
      if (a.targets[k] < 0) continue;
      auto const r = static_cast<index_t>(k);
      double mx = -INFINITY, sum = 0;
      for (index_t v = 0; v < c.vocab; ++v) mx = std::max(mx, at(r, v));
      for (index_t v = 0; v < c.vocab; ++v) sum += std::exp(at(r, v) - mx);
      want_logp[k] = at(r, a.targets[k]) - mx - std::log(sum);
    }
    double cpu_loss = 0;
    for (int parity = 0; parity < 2; ++parity) {
      twin_batch half = a;
      for (std::size_t k = 0; k < half.targets.size(); ++k)
        if (static_cast<int>(k % 2) != parity) half.targets[k] = -1;
      cpu_loss += cpu.forward(half.view(), parity == 0 ? w_even : w_odd);
      cpu.backward();
    }

    std::vector<std::int64_t> seen_rows;
    std::vector<double> seen_logp;
    gpu.set_token_loss([&](std::span<std::int64_t const> rows, std::span<double const> logp,
                           std::span<double> dlogp) {
      seen_rows.assign(rows.begin(), rows.end());
      seen_logp.assign(logp.begin(), logp.end());
      double loss = 0;
      for (std::size_t k = 0; k < logp.size(); ++k) {
        if (a.targets[k] < 0) {
          dlogp[k] = 1e3;
          continue;
        }
        double const w = k % 2 == 0 ? w_even : w_odd;
        loss -= w * logp[k];
        dlogp[k] = -w;
      }
      return loss;
    });
    double const gpu_loss = gpu.forward(a.view(), 0.5);  // the token weight is unused
    gpu.backward();
    REQUIRE(seen_rows.size() == a.targets.size());
    double worst_logp = 0;
    for (std::size_t k = 0; k < seen_rows.size(); ++k) {
      CHECK(seen_rows[k] == static_cast<std::int64_t>(k));
      if (a.targets[k] < 0) {
        CHECK(seen_logp[k] == 0.0);
        continue;
      }
      worst_logp = std::max(worst_logp, std::abs(seen_logp[k] - want_logp[k]) /
                                            std::max(1.0, std::abs(want_logp[k])));
    }
    INFO("worst log-prob error " << worst_logp);
    CHECK(worst_logp <= 1e-5);
    expect_loss(gpu_loss, cpu_loss, std::string(tc.name) + ", token loss");
    nn::param_store<float> got(nn::gpt_layout(c));
    gpu.download_grads(got);
    expect_grads(got, cpu_store, std::string(tc.name) + ", token loss");

    // A hook that writes only the even rows: the odd ones must arrive (and stay) 0, not the last
    // forward's values, so the gradient is the even pass's alone.
    gpu.zero_grad();
    cpu_store.zero_grad();
    twin_batch even = a;
    for (std::size_t k = 1; k < even.targets.size(); k += 2) even.targets[k] = -1;
    double const even_cpu = cpu.forward(even.view(), w_even);
    cpu.backward();
    bool arrived_zero = true;
    gpu.set_token_loss(
        [&](std::span<std::int64_t const>, std::span<double const> logp, std::span<double> dlogp) {
          double loss = 0;
          for (std::size_t k = 0; k < logp.size(); ++k) {
            arrived_zero = arrived_zero && dlogp[k] == 0.0;
            if (k % 2 == 0 && a.targets[k] >= 0) {
              loss -= w_even * logp[k];
              dlogp[k] = -w_even;
            }
          }
          return loss;
        });
    double const even_gpu = gpu.forward(a.view());
    gpu.backward();
    CHECK(arrived_zero);
    expect_loss(even_gpu, even_cpu, std::string(tc.name) + ", even rows only");
    gpu.download_grads(got);
    expect_grads(got, cpu_store, std::string(tc.name) + ", even rows only");

    // An empty function restores the weighted cross-entropy.
    gpu.set_token_loss({});
    gpu.zero_grad();
    cpu_store.zero_grad();
    double const ce_cpu = cpu.forward(a.view(), 0.05);
    cpu.backward();
    double const ce_gpu = gpu.forward(a.view(), 0.05);
    gpu.backward();
    expect_loss(ce_gpu, ce_cpu, std::string(tc.name) + ", cross-entropy again");
    gpu.download_grads(got);
    expect_grads(got, cpu_store, std::string(tc.name) + ", cross-entropy again");
  }
}

TEST_CASE("nn/cuda gpt: fused AdamW over the device buffers follows optim::adamw<float>") {
  if (!have_cuda_device()) return;
  auto const c = make_config(17, 16, 16, 4, 2, 2, 0);
  twin_batch const data({7, 1, 10, 4}, c.vocab, 3);
  optim::adamw_options opt;
  opt.lr = 1e-3;
  opt.weight_decay = 0.1;
  auto const infos = nn::gpt_layout(c).infos();
  constexpr int steps = 3;

  // The whole CPU path.
  auto cpu_store = make_twin_store(c, 4.0);
  nn::gpt<float> cpu(c, cpu_store);
  optim::adamw<float> cpu_opt(infos, opt);
  // The device path, and a CPU optimizer fed the device's own gradients.
  auto start = make_twin_store(c, 4.0);
  nn::cuda_gpt<float> gpu(c);
  gpu.upload_params(start);
  dbuf<float> m(gpu.size()), v(gpu.size());
  optim::adamw<float> shadow_opt(infos, opt);
  nn::param_store<float> shadow(nn::gpt_layout(c)), got(nn::gpt_layout(c));
  cudaStream_t const stream = gpu.executor().stream;

  for (int step = 1; step <= steps; ++step) {
    CAPTURE(step);
    cpu_store.zero_grad();
    double const l_cpu = cpu.forward(data.view());
    cpu.backward();
    cpu_opt.step(cpu_store.params(), cpu_store.grads());

    gpu.zero_grad();
    double const l_gpu = gpu.forward(data.view());
    gpu.backward();
    gpu.download_params(shadow);
    gpu.download_grads(shadow);
    weft::optim::kernels::adamw_step(stream, std::span<optim::param_info const>(infos),
                                     gpu.params(), static_cast<float const*>(gpu.grads()), m.p, v.p,
                                     opt, step, opt.lr);
    shadow_opt.step(shadow.params(), shadow.grads());
    gpu.download_params(got);
    expect_loss(l_gpu, l_cpu, "AdamW step " + std::to_string(step));

    double worst = 0;
    for (std::size_t i = 0; i < got.params().size(); ++i) {
      double const want = shadow.params()[i];
      worst = std::max(worst, std::abs(static_cast<double>(got.params()[i]) - want) /
                                  std::max(std::abs(want), 1.0));
    }
    INFO("device AdamW against optim::adamw on the same gradients: " << worst);
    CHECK(worst <= 1e-6);
  }

  double const bound = steps * 2.0 * 3.2 * opt.lr;
  double widest = 0;
  std::size_t apart = 0;
  for (std::size_t i = 0; i < got.params().size(); ++i) {
    double const d =
        std::abs(static_cast<double>(got.params()[i]) - static_cast<double>(cpu_store.params()[i]));
    widest = std::max(widest, std::isfinite(d) ? d : INFINITY);
    apart += d > 1e-2 * opt.lr ? 1 : 0;
  }
  MESSAGE("after " << steps << " AdamW steps: max |gpu - cpu| " << widest << " (lr " << opt.lr
                   << "), " << apart << " of " << got.params().size()
                   << " elements more than 1e-2·lr apart");
  CHECK(widest <= bound);
  CHECK(static_cast<double>(apart) <= 0.01 * static_cast<double>(got.params().size()));
}

TEST_CASE("nn/cuda gpt: bad configurations, stores and batches are refused before any launch") {
  // The configuration is validated before anything is allocated: no device needed.
  auto bad = make_config(11, 8, 8, 2, 3, 1, 0);
  nn_test::expect_throw<weft::invalid_argument_error>([&] { nn::cuda_gpt<float> g(bad); },
                                                      "`gpt_config::kv_heads`");
  if (!have_cuda_device()) return;
  auto const c = make_config(11, 8, 8, 2, 1, 2, 12);
  auto store = make_twin_store(c, 4.0);
  nn::gpt<float> cpu(c, store);
  nn::cuda_gpt<float> gpu(c);
  nn_test::expect_throw<weft::invalid_argument_error>([&] { gpu.backward(); }, "`forward`");
  auto other = c;
  other.layers = 1;
  nn::param_store<float> small(nn::gpt_layout(other));
  nn_test::expect_throw<weft::shape_error>([&] { gpu.upload_params(small); }, "`store`");
  // The same parameter count and total, one name different: another layout all the same.
  nn::param_layout renamed;
  nn::param_layout const layout = nn::gpt_layout(c);  // named: a range-for over a temporary's
                                                      // entries() would read a destroyed layout
  for (auto const& e : layout.entries())
    renamed.add(e.name == "wpe" ? std::string("wpx") : e.name, e.shape, e.info);
  nn::param_store<float> impostor(renamed);
  nn_test::expect_throw<weft::shape_error>([&] { gpu.upload_params(impostor); },
                                           "`store parameter 1`");
  gpu.upload_params(store);

  twin_batch const good({4, 5}, c.vocab, 2);
  double const l_cpu = cpu.forward(good.view());
  double const l_gpu = gpu.forward(good.view());
  expect_loss(l_gpu, l_cpu, "before the refused batches");

  using bad_value = weft::invalid_argument_error;
  using bad_shape = weft::shape_error;
  refuse<bad_value>(
      gpu, good, [](twin_batch& d) { d.targets[2] = 11; }, "`targets[2]`");
  refuse<bad_value>(
      gpu, good, [](twin_batch& d) { d.targets[1] = -2; }, "`targets[1]`");
  refuse<bad_value>(
      gpu, good, [](twin_batch& d) { d.tokens[0] = 11; }, "`tokens[0]`");
  refuse<bad_value>(
      gpu, good, [](twin_batch& d) { d.positions[3] = 8; }, "`positions[3]`");
  refuse<bad_shape>(
      gpu, good, [](twin_batch& d) { d.positions.pop_back(); }, "`positions`");
  refuse<bad_shape>(
      gpu, good, [](twin_batch& d) { d.targets.push_back(1); }, "`targets`");
  refuse<bad_value>(
      gpu, good, [](twin_batch& d) { d.cu.back() = 8; }, "`cu_seqlens`");
  refuse<bad_value>(
      gpu, good,
      [](twin_batch& d) {
        d.cu = {0, 6, 5, 9};
      },
      "`cu_seqlens`");
  refuse<bad_value>(
      gpu, good, [](twin_batch& d) { d.cu = {9}; }, "`cu_seqlens`");

  // Nothing of the good forward was overwritten: its backward still gives the CPU's gradients.
  cpu.backward();
  gpu.backward();
  nn::param_store<float> got(nn::gpt_layout(c));
  gpu.download_grads(got);
  expect_grads(got, store, "after the refused batches");
}

#endif  // __CUDACC__ && WEFT_HAS_CUDA_RUNTIME
