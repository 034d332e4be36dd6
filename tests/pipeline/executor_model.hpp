// tests/pipeline/executor_model.hpp — the model the executor tests run, shared by the thread-rank
// tests (executor.test.cpp) and the MPI ones (mpi/executor.test.cpp): a small f32 MLP (linear +
// tanh layers with hand-written backward, a linear head and a squared-error loss) split into
// pipeline stages (mlp_stage), a vocabulary-parallel embedding and output layer (vocab_shard), and
// three single-rank references: sequential gradient accumulation (bit-for-bit target), the whole
// batch in one pass (1e-5 target) and the vocabulary model with a plain softmax.
#pragma once

#include <weft/pipeline/executor.hpp>
#include <weft/pipeline/schedule.hpp>
#include <weft/pipeline/stage.hpp>
#include <weft/pipeline/step.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <span>
#include <stdexcept>
#include <utility>
#include <vector>

namespace weft::test::pipeline_model {

namespace pl = weft::pipeline;
namespace comm = weft::comm;

// ---- the model: layers with hand-written backward, shared by the stages and the reference ----

inline constexpr int width = 6;     // hidden features (also the input width)
inline constexpr int head_out = 3;  // output features of the last stage's head
inline constexpr int layers_per_stage = 2;

// Counter-based init: a value depends only on (stream, index), so any split of the model
// initialises like the whole model.
inline float uniform(std::uint64_t stream, std::uint64_t index, float scale) {
  std::uint64_t z = stream * 0x9E3779B97F4A7C15ull + index + 0x632BE59BD9B4E019ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  auto const u = static_cast<double>(z >> 11) * 0x1.0p-53;  // [0, 1)
  return static_cast<float>((2.0 * u - 1.0) * scale);
}

struct layer {
  int in = 0, out = 0;
  bool tanh_act = true;
  std::vector<float> w, b, gw, gb;  // w: [out][in]

  layer(int id, int in_, int out_, bool act) : in(in_), out(out_), tanh_act(act) {
    auto const n = static_cast<std::size_t>(in) * static_cast<std::size_t>(out);
    w.resize(n);
    b.resize(static_cast<std::size_t>(out));
    for (std::size_t i = 0; i < n; ++i) w[i] = uniform(2 * static_cast<std::uint64_t>(id), i, 0.6f);
    for (std::size_t i = 0; i < b.size(); ++i)
      b[i] = uniform(2 * static_cast<std::uint64_t>(id) + 1, i, 0.1f);
    gw.assign(n, 0.0f);
    gb.assign(b.size(), 0.0f);
  }

  // y[r] = act(W x[r] + b) for rows r < n.
  void forward(float const* x, int n, float* y) const {
    for (int r = 0; r < n; ++r)
      for (int o = 0; o < out; ++o) {
        float z = b[static_cast<std::size_t>(o)];
        for (int i = 0; i < in; ++i) z += w[static_cast<std::size_t>(o * in + i)] * x[r * in + i];
        y[r * out + o] = tanh_act ? std::tanh(z) : z;
      }
  }
  // dz = dy * act'(z) (from y); dx = W^T dz unless dx is null.
  void backward_input(float const* y, float const* dy, int n, float* dz, float* dx) const {
    for (int k = 0; k < n * out; ++k) dz[k] = tanh_act ? dy[k] * (1.0f - y[k] * y[k]) : dy[k];
    if (dx == nullptr) return;
    for (int r = 0; r < n; ++r)
      for (int i = 0; i < in; ++i) {
        float acc = 0.0f;
        for (int o = 0; o < out; ++o)
          acc += w[static_cast<std::size_t>(o * in + i)] * dz[r * out + o];
        dx[r * in + i] = acc;
      }
  }
  // gw += sum over rows of dz x^T, gb += sum of dz, row by row into the accumulators.
  void backward_weight(float const* x, float const* dz, int n) {
    for (int r = 0; r < n; ++r)
      for (int o = 0; o < out; ++o) {
        float const d = dz[r * out + o];
        for (int i = 0; i < in; ++i) gw[static_cast<std::size_t>(o * in + i)] += d * x[r * in + i];
        gb[static_cast<std::size_t>(o)] += d;
      }
  }
};

// Squared error: loss = w * sum_r 0.5 |y_r - t_r|^2 (double), dy = w (y - t) (f32).
inline double squared_error(float const* y, float const* t, int n, double weight, float* dy) {
  double sum = 0.0;
  for (int k = 0; k < n * head_out; ++k) {
    double const d = static_cast<double>(y[k]) - static_cast<double>(t[k]);
    sum += 0.5 * d * d;
    if (dy != nullptr) dy[k] = static_cast<float>(weight * d);
  }
  return weight * sum;
}

// Rows (tokens) of microbatch i: uneven on purpose.
inline int rows_of(int mb) { return 1 + (mb * 5 + 2) % 4; }

struct data_set {
  std::vector<std::vector<float>> x, t;
  explicit data_set(int m) {
    for (int i = 0; i < m; ++i) {
      auto const n = static_cast<std::size_t>(rows_of(i));
      std::vector<float> xi(n * width), ti(n * head_out);
      for (std::size_t k = 0; k < xi.size(); ++k) xi[k] = uniform(1000 + 2 * i, k, 1.0f);
      for (std::size_t k = 0; k < ti.size(); ++k) ti[k] = uniform(1001 + 2 * i, k, 0.8f);
      x.push_back(std::move(xi));
      t.push_back(std::move(ti));
    }
  }
};

// The layers of global stage s in a model of `stages` stages: layers_per_stage linear + tanh,
// plus the linear head on the last stage. Layer ids are global, so init does not depend on the
// split.
// With `head` false (vocabulary parallelism) the last stage ends at its last tanh layer and the
// vocabulary-parallel output layer follows.
inline std::vector<layer> stage_layers(int s, int stages, bool head = true) {
  std::vector<layer> out;
  for (int l = 0; l < layers_per_stage; ++l)
    out.emplace_back(s * (layers_per_stage + 1) + l, width, width, true);
  if (head && s == stages - 1)
    out.emplace_back(s * (layers_per_stage + 1) + layers_per_stage, width, head_out, false);
  return out;
}

// ---- the pipeline stage: all chunks of one rank ------------------------------------------------

class mlp_stage {
 public:
  using stage_concept = pl::stage_tag;

  // The stages of `rank` in `sched`'s mapping, with their layers and the data they need.
  // `vocab`: stage 0 takes the embedding as its input and the last stage hands its activation to
  // the vocabulary-parallel output layer (no head, no loss of its own).
  mlp_stage(pl::schedule const& sched, int rank, data_set const& data, bool vocab = false)
      : stages_(sched.num_stages()), data_(&data), vocab_(vocab) {
    for (int s = 0; s < stages_; ++s)
      if (sched.stage_to_rank(s) == rank)
        chunks_.push_back({s, stage_layers(s, stages_, !vocab), {}});
  }

  pl::message_layout input_layout(pl::stage_call const& c) const {
    if (c.stage == 0 && !vocab_) return {0, layout_type};
    return {static_cast<std::size_t>(rows_of(c.microbatch) * width) + input_extra, layout_type};
  }
  pl::message_layout output_layout(pl::stage_call const& c) const {
    if (c.stage == stages_ - 1 && !vocab_) return {0, layout_type};
    return {static_cast<std::size_t>(rows_of(c.microbatch) * width), layout_type};
  }

  void reserve_slots(int chunk, int slots) {
    auto& ch = chunk_of(chunk);
    ch.slots.resize(static_cast<std::size_t>(slots));
    int const max_rows = 4;
    for (auto& sl : ch.slots) {
      sl.acts.assign(ch.layers.size() + 1, {});
      sl.dz.assign(ch.layers.size(), {});
      for (std::size_t l = 0; l <= ch.layers.size(); ++l)
        sl.acts[l].resize(
            static_cast<std::size_t>(max_rows * (l == 0 ? ch.layers[0].in : ch.layers[l - 1].out)));
      for (std::size_t l = 0; l < ch.layers.size(); ++l)
        sl.dz[l].resize(static_cast<std::size_t>(max_rows * ch.layers[l].out));
    }
    reserved_ += slots;
  }

  double forward(pl::stage_call const& c, comm::buffer_view in, comm::buffer_view out) {
    if (fail_at && fail_at(c, "forward")) throw std::runtime_error("injected stage failure");
    auto& ch = chunk_of(c.chunk);
    REQUIRE(ch.stage == c.stage);
    auto& sl = slot(ch, c);
    int const n = rows_of(c.microbatch);
    float const* x = c.stage == 0 && !vocab_
                         ? data_->x[static_cast<std::size_t>(c.microbatch)].data()
                         : static_cast<float const*>(in.data);
    std::memcpy(sl.acts[0].data(), x, static_cast<std::size_t>(n * width) * sizeof(float));
    for (std::size_t l = 0; l < ch.layers.size(); ++l)
      ch.layers[l].forward(sl.acts[l].data(), n, sl.acts[l + 1].data());
    if (c.last_stage() && !vocab_) {
      return squared_error(sl.acts.back().data(),
                           data_->t[static_cast<std::size_t>(c.microbatch)].data(), n,
                           c.loss_weight, nullptr);
    }
    REQUIRE(out.count == static_cast<std::size_t>(n * width));
    std::memcpy(out.data, sl.acts.back().data(), out.bytes());
    return 0.0;
  }

  void backward_input(pl::stage_call const& c, comm::buffer_view dout, comm::buffer_view din) {
    if (fail_at && fail_at(c, "backward_input")) throw std::runtime_error("injected stage failure");
    auto& ch = chunk_of(c.chunk);
    auto& sl = slot(ch, c);
    int const n = rows_of(c.microbatch);
    auto const nl = ch.layers.size();
    std::vector<float> dy;
    if (c.last_stage() && !vocab_) {
      dy.resize(static_cast<std::size_t>(n * head_out));
      squared_error(sl.acts.back().data(), data_->t[static_cast<std::size_t>(c.microbatch)].data(),
                    n, c.loss_weight, dy.data());
    } else {
      auto const* g = static_cast<float const*>(dout.data);
      dy.assign(g, g + dout.count);
    }
    for (std::size_t l = nl; l-- > 0;) {
      bool const first = l == 0;
      std::vector<float> dx(static_cast<std::size_t>(n * ch.layers[l].in));
      ch.layers[l].backward_input(sl.acts[l + 1].data(), dy.data(), n, sl.dz[l].data(),
                                  first && c.stage == 0 && !vocab_ ? nullptr : dx.data());
      dy = std::move(dx);
    }
    if (c.stage > 0 || vocab_) {
      REQUIRE(din.count == dy.size());
      std::memcpy(din.data, dy.data(), din.bytes());
    }
  }

  void backward_weight(pl::stage_call const& c) {
    auto& ch = chunk_of(c.chunk);
    auto& sl = slot(ch, c);
    int const n = rows_of(c.microbatch);
    for (std::size_t l = 0; l < ch.layers.size(); ++l)
      ch.layers[l].backward_weight(sl.acts[l].data(), sl.dz[l].data(), n);
    weight_order.push_back(c.microbatch);
  }

  struct slot_state {
    std::vector<std::vector<float>> acts;  // acts[0] input, acts[l+1] output of layer l
    std::vector<std::vector<float>> dz;
  };
  struct chunk_state {
    int stage = 0;
    std::vector<layer> layers;
    std::vector<slot_state> slots;
  };

  std::vector<chunk_state> chunks_;
  std::function<bool(pl::stage_call const&, char const*)> fail_at;
  std::vector<int> weight_order;
  int reserved_ = 0;
  std::size_t input_extra = 0;                 // a wrong input layout, for the mismatch test
  weft::dtype layout_type = weft::dtype::f32;  // a declared type (the data stay f32)

 private:
  chunk_state& chunk_of(int chunk) {
    REQUIRE(chunk >= 0);
    REQUIRE(static_cast<std::size_t>(chunk) < chunks_.size());
    return chunks_[static_cast<std::size_t>(chunk)];
  }
  static slot_state& slot(chunk_state& ch, pl::stage_call const& c) {
    REQUIRE(c.slot >= 0);
    REQUIRE(static_cast<std::size_t>(c.slot) < ch.slots.size());
    return ch.slots[static_cast<std::size_t>(c.slot)];
  }

  int stages_ = 0;
  data_set const* data_ = nullptr;
  bool vocab_ = false;
};

static_assert(pl::Stage<mlp_stage>);
static_assert(!pl::FusedBackwardStage<mlp_stage>);

// ---- reference A: sequential gradient accumulation on one rank ---------------------------------

struct model_result {
  double loss = 0.0;
  std::vector<std::vector<layer>> stages;  // layers with accumulated gradients, per global stage
};

// `passes` runs the whole accumulation that many times into the same gradients (the loss is the
// last pass's).
inline model_result sequential_reference(int stages, int m, std::vector<double> const& weights,
                                         data_set const& data, int passes = 1) {
  model_result res;
  for (int s = 0; s < stages; ++s) res.stages.push_back(stage_layers(s, stages));
  for (int pass = 0; pass < passes; ++pass) {
    res.loss = 0.0;
    for (int i = 0; i < m; ++i) {
      int const n = rows_of(i);
      // Forward through every layer of every stage, keeping each layer's input and output.
      std::vector<std::vector<std::vector<float>>> acts(static_cast<std::size_t>(stages));
      std::vector<float> x = data.x[static_cast<std::size_t>(i)];
      for (int s = 0; s < stages; ++s) {
        auto& ls = res.stages[static_cast<std::size_t>(s)];
        auto& a = acts[static_cast<std::size_t>(s)];
        a.push_back(x);
        for (auto const& l : ls) {
          std::vector<float> y(static_cast<std::size_t>(n * l.out));
          l.forward(a.back().data(), n, y.data());
          a.push_back(std::move(y));
        }
        x = a.back();
      }
      auto const w = weights[static_cast<std::size_t>(i)];
      std::vector<float> dy(static_cast<std::size_t>(n * head_out));
      res.loss += squared_error(acts.back().back().data(),
                                data.t[static_cast<std::size_t>(i)].data(), n, w, dy.data());
      // Backward through every layer, accumulating each layer's gradients right away.
      for (int s = stages; s-- > 0;) {
        auto& ls = res.stages[static_cast<std::size_t>(s)];
        auto& a = acts[static_cast<std::size_t>(s)];
        for (std::size_t l = ls.size(); l-- > 0;) {
          std::vector<float> dz(static_cast<std::size_t>(n * ls[l].out));
          std::vector<float> dx(static_cast<std::size_t>(n * ls[l].in));
          ls[l].backward_input(a[l + 1].data(), dy.data(), n, dz.data(),
                               s == 0 && l == 0 ? nullptr : dx.data());
          ls[l].backward_weight(a[l].data(), dz.data(), n);
          dy = std::move(dx);
        }
      }
    }
  }
  return res;
}

inline bool same_bits(std::vector<float> const& a, std::vector<float> const& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (std::bit_cast<std::uint32_t>(a[i]) != std::bit_cast<std::uint32_t>(b[i])) return false;
  return true;
}

// ---- reference C: the whole batch in one pass ---------------------------------------------------

// Every microbatch's rows stacked into one batch, one forward and one backward through every
// layer: the gradients of a single full-batch step (the loss weights are per microbatch, so each
// row carries its microbatch's weight). Summation order differs from the pipelined
// accumulation, so the comparison is relative, not bitwise.
inline model_result full_batch_reference(int stages, int m, std::vector<double> const& weights,
                                         data_set const& data) {
  model_result res;
  for (int s = 0; s < stages; ++s) res.stages.push_back(stage_layers(s, stages));
  int rows = 0;
  std::vector<float> x, t;
  std::vector<double> row_weight;
  for (int i = 0; i < m; ++i) {
    rows += rows_of(i);
    auto const& xi = data.x[static_cast<std::size_t>(i)];
    auto const& ti = data.t[static_cast<std::size_t>(i)];
    x.insert(x.end(), xi.begin(), xi.end());
    t.insert(t.end(), ti.begin(), ti.end());
    row_weight.insert(row_weight.end(), static_cast<std::size_t>(rows_of(i)),
                      weights[static_cast<std::size_t>(i)]);
  }
  std::vector<std::vector<std::vector<float>>> acts(static_cast<std::size_t>(stages));
  for (int s = 0; s < stages; ++s) {
    auto& a = acts[static_cast<std::size_t>(s)];
    a.push_back(x);
    for (auto const& l : res.stages[static_cast<std::size_t>(s)]) {
      std::vector<float> y(static_cast<std::size_t>(rows * l.out));
      l.forward(a.back().data(), rows, y.data());
      a.push_back(std::move(y));
    }
    x = a.back();
  }
  std::vector<float> dy(static_cast<std::size_t>(rows * head_out));
  for (int r = 0; r < rows; ++r)
    res.loss += squared_error(x.data() + r * head_out, t.data() + r * head_out, 1,
                              row_weight[static_cast<std::size_t>(r)], dy.data() + r * head_out);
  for (int s = stages; s-- > 0;) {
    auto& ls = res.stages[static_cast<std::size_t>(s)];
    auto& a = acts[static_cast<std::size_t>(s)];
    for (std::size_t l = ls.size(); l-- > 0;) {
      std::vector<float> dz(static_cast<std::size_t>(rows * ls[l].out));
      std::vector<float> dx(static_cast<std::size_t>(rows * ls[l].in));
      ls[l].backward_input(a[l + 1].data(), dy.data(), rows, dz.data(),
                           s == 0 && l == 0 ? nullptr : dx.data());
      ls[l].backward_weight(a[l].data(), dz.data(), rows);
      dy = std::move(dx);
    }
  }
  return res;
}

// max |a - b| <= tol max |b|: relative to the largest reference element.
inline bool close_rel(std::vector<float> const& a, std::vector<float> const& b, double tol) {
  if (a.size() != b.size()) return false;
  double scale = 0.0, diff = 0.0;
  for (std::size_t k = 0; k < a.size(); ++k) {
    scale = std::max(scale, std::abs(static_cast<double>(b[k])));
    diff = std::max(diff, std::abs(static_cast<double>(a[k]) - static_cast<double>(b[k])));
  }
  return diff <= tol * scale;
}

// ---- vocabulary parallelism: a sharded embedding and output layer
// -----------------------------------------

inline constexpr int vocab_size = 12;  // divisible by 1, 2, 3 and 4 ranks

struct vocab_data {
  std::vector<std::vector<int>> ids, targets;
  explicit vocab_data(int m) {
    for (int i = 0; i < m; ++i) {
      std::vector<int> a, b;
      for (int t = 0; t < rows_of(i); ++t) {
        auto const u = static_cast<std::uint64_t>(i * 16 + t);
        a.push_back(static_cast<int>((uniform(700, u, 1.0f) + 1.0f) * 0.5f * vocab_size) %
                    vocab_size);
        b.push_back(static_cast<int>((uniform(701, u, 1.0f) + 1.0f) * 0.5f * vocab_size) %
                    vocab_size);
      }
      ids.push_back(std::move(a));
      targets.push_back(std::move(b));
    }
  }
};

// Rows [lo, hi) of the embedding (stream 500) and of the output layer (stream 501), with their
// gradients. The full tables are the p = 1 shard.
struct vocab_tables {
  int lo = 0, hi = vocab_size;
  std::vector<float> e, w, ge, gw;
  vocab_tables(int lo_, int hi_) : lo(lo_), hi(hi_) {
    auto const n = static_cast<std::size_t>((hi - lo) * width);
    e.resize(n);
    w.resize(n);
    for (std::size_t k = 0; k < n; ++k) {
      auto const g = static_cast<std::uint64_t>(lo * width) + k;  // global element index
      e[k] = uniform(500, g, 0.8f);
      w[k] = uniform(501, g, 0.8f);
    }
    ge.assign(n, 0.0f);
    gw.assign(n, 0.0f);
  }
  float* row(std::vector<float>& t, int v) { return t.data() + (v - lo) * width; }
  bool owns(int v) const { return v >= lo && v < hi; }
  // Logits of row x over the owned vocabulary.
  void logits(float const* x, std::vector<float>& y) {
    y.assign(static_cast<std::size_t>(hi - lo), 0.0f);
    for (int v = lo; v < hi; ++v) {
      float acc = 0.0f;
      for (int k = 0; k < width; ++k) acc += row(w, v)[k] * x[k];
      y[static_cast<std::size_t>(v - lo)] = acc;
    }
  }
};

class vocab_shard {
 public:
  using vocab_concept = pl::vocab_tag;
  vocab_shard(int rank, int ranks, vocab_data const& data)
      : tables_(rank * vocab_size / ranks, (rank + 1) * vocab_size / ranks), data_(&data) {}

  std::size_t tokens(pl::stage_call const& c) const {
    return static_cast<std::size_t>(rows_of(c.microbatch));
  }
  std::size_t hidden() const { return width; }

  void input_forward(pl::stage_call const& c, comm::buffer_view partial) {
    auto* out = static_cast<float*>(partial.data);
    auto const& ids = data_->ids[static_cast<std::size_t>(c.microbatch)];
    for (std::size_t t = 0; t < ids.size(); ++t)
      for (int k = 0; k < width; ++k)
        out[t * width + k] = tables_.owns(ids[t]) ? tables_.row(tables_.e, ids[t])[k] : 0.0f;
  }
  void input_backward(pl::stage_call const& c, comm::buffer_view grad) {
    auto const* g = static_cast<float const*>(grad.data);
    auto const& ids = data_->ids[static_cast<std::size_t>(c.microbatch)];
    for (std::size_t t = 0; t < ids.size(); ++t)
      if (tables_.owns(ids[t]))
        for (int k = 0; k < width; ++k) tables_.row(tables_.ge, ids[t])[k] += g[t * width + k];
  }
  void output_forward(pl::stage_call const& c, comm::buffer_view xv, comm::buffer_view stats) {
    if (fail_at && fail_at(c)) throw std::runtime_error("injected vocabulary failure");
    auto const* x = static_cast<float const*>(xv.data);
    auto* st = static_cast<float*>(stats.data);
    auto const& tg = data_->targets[static_cast<std::size_t>(c.microbatch)];
    std::size_t const n = tg.size(), h = width;
    bool const one = stats.count == 3 * n + 2 * n * h;
    REQUIRE((one || stats.count == 3 * n));
    std::vector<float> y;
    for (std::size_t t = 0; t < n; ++t) {
      tables_.logits(x + t * h, y);
      float const mx = *std::max_element(y.begin(), y.end());
      float s = 0.0f;
      for (float v : y) s += std::exp(v - mx);
      st[t] = mx;
      st[n + t] = s;
      st[2 * n + t] = tables_.owns(tg[t]) ? y[static_cast<std::size_t>(tg[t] - tables_.lo)] : 0.0f;
      if (!one) continue;
      for (std::size_t k = 0; k < h; ++k) {
        float gk = 0.0f;
        for (int v = tables_.lo; v < tables_.hi; ++v)
          gk += std::exp(y[static_cast<std::size_t>(v - tables_.lo)] - mx) *
                tables_.row(tables_.w, v)[k];
        st[3 * n + t * h + k] = gk;
        st[3 * n + n * h + t * h + k] =
            tables_.owns(tg[t]) ? tables_.row(tables_.w, tg[t])[k] : 0.0f;
      }
    }
  }
  void output_backward(pl::stage_call const& c, comm::buffer_view xv, comm::buffer_view gv,
                       comm::buffer_view maxv, comm::buffer_view sumv, comm::buffer_view dxv) {
    auto const* x = static_cast<float const*>(xv.data);
    auto const* g = static_cast<float const*>(gv.data);
    auto const* mx = static_cast<float const*>(maxv.data);
    auto const* sm = static_cast<float const*>(sumv.data);
    auto* dx = static_cast<float*>(dxv.data);
    auto const& tg = data_->targets[static_cast<std::size_t>(c.microbatch)];
    std::size_t const n = tg.size(), h = width;
    REQUIRE(gv.count == n);
    std::vector<float> y;
    for (std::size_t t = 0; t < n; ++t) {
      tables_.logits(x + t * h, y);
      if (!dxv.empty())
        for (std::size_t k = 0; k < h; ++k) dx[t * h + k] = 0.0f;
      for (int v = tables_.lo; v < tables_.hi; ++v) {
        float const pr = std::exp(y[static_cast<std::size_t>(v - tables_.lo)] - mx[t]) / sm[t];
        float const d = g[t] * (pr - (v == tg[t] ? 1.0f : 0.0f));
        for (std::size_t k = 0; k < h; ++k) {
          tables_.row(tables_.gw, v)[k] += d * x[t * h + k];
          if (!dxv.empty()) dx[t * h + k] += d * tables_.row(tables_.w, v)[k];
        }
      }
    }
  }

  vocab_tables tables_;
  std::function<bool(pl::stage_call const&)> fail_at;

 private:
  vocab_data const* data_;
};
static_assert(pl::VocabShard<vocab_shard>);

// Reference B for vocabulary parallelism: one rank, the whole vocabulary, a plain softmax
// cross-entropy per token, microbatches in order; or, given `token_loss` (step_options's), that
// loss of the tokens' log p(target), its gradient through the logits dlogp_t (onehot - softmax).
struct vocab_reference_result {
  double loss = 0.0;
  std::vector<std::vector<layer>> stages;
  vocab_tables tables{0, vocab_size};
};

using token_loss_fn = std::function<double(int, std::span<double const>, std::span<double>)>;

inline vocab_reference_result vocab_reference(int stages, int m, std::vector<double> const& weights,
                                              vocab_data const& vd,
                                              token_loss_fn const& token_loss = {}) {
  vocab_reference_result res;
  for (int s = 0; s < stages; ++s) res.stages.push_back(stage_layers(s, stages, false));
  auto& tb = res.tables;
  for (int i = 0; i < m; ++i) {
    int const n = rows_of(i);
    auto const& ids = vd.ids[static_cast<std::size_t>(i)];
    auto const& tg = vd.targets[static_cast<std::size_t>(i)];
    std::vector<float> x(static_cast<std::size_t>(n * width));
    for (int t = 0; t < n; ++t)
      for (int k = 0; k < width; ++k)
        x[static_cast<std::size_t>(t * width + k)] =
            tb.row(tb.e, ids[static_cast<std::size_t>(t)])[k];
    std::vector<std::vector<std::vector<float>>> acts(static_cast<std::size_t>(stages));
    for (int s = 0; s < stages; ++s) {
      auto& a = acts[static_cast<std::size_t>(s)];
      a.push_back(x);
      for (auto const& l : res.stages[static_cast<std::size_t>(s)]) {
        std::vector<float> y(static_cast<std::size_t>(n * l.out));
        l.forward(a.back().data(), n, y.data());
        a.push_back(std::move(y));
      }
      x = a.back();
    }
    double const w = weights[static_cast<std::size_t>(i)];
    std::vector<float> dy(static_cast<std::size_t>(n * width), 0.0f), y;
    // The per-token loss-gradient weights g_t: w for the cross-entropy, -dlogp_t for token_loss.
    std::vector<double> g(static_cast<std::size_t>(n), w);
    if (token_loss) {
      std::vector<double> logp(static_cast<std::size_t>(n)), dlogp(static_cast<std::size_t>(n));
      for (int t = 0; t < n; ++t) {
        tb.logits(x.data() + t * width, y);
        double const mx = *std::max_element(y.begin(), y.end());
        double s = 0.0;
        for (float v : y) s += std::exp(static_cast<double>(v) - mx);
        auto const target = static_cast<std::size_t>(tg[static_cast<std::size_t>(t)]);
        logp[static_cast<std::size_t>(t)] = static_cast<double>(y[target]) - mx - std::log(s);
      }
      res.loss += token_loss(i, logp, dlogp);
      for (std::size_t t = 0; t < g.size(); ++t) g[t] = -dlogp[t];
    }
    for (int t = 0; t < n; ++t) {
      float const* xt = x.data() + t * width;
      tb.logits(xt, y);
      double const mx = *std::max_element(y.begin(), y.end());
      double s = 0.0;
      for (float v : y) s += std::exp(static_cast<double>(v) - mx);
      int const target = tg[static_cast<std::size_t>(t)];
      if (!token_loss)
        res.loss +=
            w * (std::log(s) - (static_cast<double>(y[static_cast<std::size_t>(target)]) - mx));
      double const gt = g[static_cast<std::size_t>(t)];
      for (int v = 0; v < vocab_size; ++v) {
        double const pr = std::exp(static_cast<double>(y[static_cast<std::size_t>(v)]) - mx) / s;
        auto const d = static_cast<float>(gt * (pr - (v == target ? 1.0 : 0.0)));
        for (int k = 0; k < width; ++k) {
          tb.row(tb.gw, v)[k] += d * xt[k];
          dy[static_cast<std::size_t>(t * width + k)] += d * tb.row(tb.w, v)[k];
        }
      }
    }
    for (int s = stages; s-- > 0;) {
      auto& ls = res.stages[static_cast<std::size_t>(s)];
      auto& a = acts[static_cast<std::size_t>(s)];
      for (std::size_t l = ls.size(); l-- > 0;) {
        std::vector<float> dz(static_cast<std::size_t>(n * ls[l].out));
        std::vector<float> dx(static_cast<std::size_t>(n * ls[l].in));
        ls[l].backward_input(a[l + 1].data(), dy.data(), n, dz.data(), dx.data());
        ls[l].backward_weight(a[l].data(), dz.data(), n);
        dy = std::move(dx);
      }
    }
    for (int t = 0; t < n; ++t)
      for (int k = 0; k < width; ++k)
        tb.row(tb.ge, ids[static_cast<std::size_t>(t)])[k] +=
            dy[static_cast<std::size_t>(t * width + k)];
  }
  return res;
}

// max |a - b| <= 1e-5 max |b| + 1e-7: fp32 against a differently associated reference.
inline bool close(std::vector<float> const& a, std::vector<float> const& b) {
  if (a.size() != b.size()) return false;
  double scale = 0.0, diff = 0.0;
  for (std::size_t k = 0; k < a.size(); ++k) {
    scale = std::max(scale, std::abs(static_cast<double>(b[k])));
    diff = std::max(diff, std::abs(static_cast<double>(a[k]) - static_cast<double>(b[k])));
  }
  return diff <= 1e-5 * scale + 1e-7;
}

}  // namespace weft::test::pipeline_model
