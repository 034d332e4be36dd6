// Tests for weft/pipeline/executor.hpp, stage.hpp and measured.hpp. A small f32 MLP (linear + tanh
// layers with hand-written backward, a linear head and a squared-error loss) split into pipeline
// stages runs under GPipe, 1F1B, interleaved 1F1B, ZB-H1 and ZBV on 1, 2 and 4 thread ranks, and
// its loss and every parameter gradient equal sequential gradient accumulation on one rank bit for
// bit (the rule that makes this hold: each chunk accumulates its B/W in increasing microbatch
// order, which the executor enforces). The vocabulary-balanced schedules (1 and 2 barriers) with
// a vocabulary-parallel embedding and output layer match the single-device model within fp32
// tolerances. A stage or vocabulary pass that throws on one rank, a rank that never runs, and a
// layout mismatch make every rank throw within the deadline, naming rank, action and microbatch.
// Sleeping stages check that the measured makespan follows the simulation of the measured times.
#include <weft/comm/threads/world.hpp>
#include <weft/pipeline/executor.hpp>
#include <weft/pipeline/lower.hpp>
#include <weft/pipeline/measured.hpp>
#include <weft/pipeline/schedules/gpipe.hpp>
#include <weft/pipeline/schedules/interleaved.hpp>
#include <weft/pipeline/schedules/one_f_one_b.hpp>
#include <weft/pipeline/schedules/vocab.hpp>
#include <weft/pipeline/schedules/zero_bubble.hpp>
#include <weft/pipeline/simulate.hpp>
#include <weft/pipeline/stage.hpp>
#include <weft/pipeline/validate.hpp>

#include "support/run_ranks.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstddef>
#include <cstring>
#include <functional>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace pl = weft::pipeline;
namespace comm = weft::comm;

// Every case runs thread ranks: the `threads` suite, which CI also runs under ThreadSanitizer.
TEST_SUITE_BEGIN("threads");

namespace {

// ---- the model: layers with hand-written backward, shared by the stages and the reference ----

constexpr int width = 6;     // hidden features (also the input width)
constexpr int head_out = 3;  // output features of the last stage's head
constexpr int layers_per_stage = 2;

// Counter-based init: a value depends only on (stream, index), so any split of the model
// initialises like the whole model.
float uniform(std::uint64_t stream, std::uint64_t index, float scale) {
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
double squared_error(float const* y, float const* t, int n, double weight, float* dy) {
  double sum = 0.0;
  for (int k = 0; k < n * head_out; ++k) {
    double const d = static_cast<double>(y[k]) - static_cast<double>(t[k]);
    sum += 0.5 * d * d;
    if (dy != nullptr) dy[k] = static_cast<float>(weight * d);
  }
  return weight * sum;
}

// Rows (tokens) of microbatch i: uneven on purpose.
int rows_of(int mb) { return 1 + (mb * 5 + 2) % 4; }

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
std::vector<layer> stage_layers(int s, int stages, bool head = true) {
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
    if (c.stage == 0 && !vocab_) return {0, weft::dtype::f32};
    return {static_cast<std::size_t>(rows_of(c.microbatch) * width) + input_extra,
            weft::dtype::f32};
  }
  pl::message_layout output_layout(pl::stage_call const& c) const {
    if (c.stage == stages_ - 1 && !vocab_) return {0, weft::dtype::f32};
    return {static_cast<std::size_t>(rows_of(c.microbatch) * width), weft::dtype::f32};
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
  std::size_t input_extra = 0;  // a wrong input layout, for the mismatch test

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
static_assert(pl::PipelineCommunicator<comm::threads::communicator>);

// ---- reference A: sequential gradient accumulation on one rank ---------------------------------

struct model_result {
  double loss = 0.0;
  std::vector<std::vector<layer>> stages;  // layers with accumulated gradients, per global stage
};

// `passes` runs the whole accumulation that many times into the same gradients (the loss is the
// last pass's).
model_result sequential_reference(int stages, int m, std::vector<double> const& weights,
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

bool same_bits(std::vector<float> const& a, std::vector<float> const& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (std::bit_cast<std::uint32_t>(a[i]) != std::bit_cast<std::uint32_t>(b[i])) return false;
  return true;
}

// ---- the schedules under test ------------------------------------------------------------------

struct case_schedule {
  std::string name;
  pl::schedule compute;
};

// Every generator at (p, m) where it accepts the configuration. 1F1B and ZB-H1 refuse m < p only
// as a performance rule (Megatron's), so m = 1 runs them unchecked; `validate` below still proves
// the lowered program.
std::vector<case_schedule> schedules_for(int p, int m) {
  std::vector<case_schedule> out;
  bool const small = m < p;
  out.push_back({"gpipe", pl::gpipe(p, m)});
  out.push_back({"1f1b", pl::one_f_one_b(p, m, pl::generator_options{small})});
  try {
    out.push_back({"interleaved v2", pl::interleaved_one_f_one_b(p, m, 2)});
  } catch (weft::schedule_error const&) {
    // Megatron's group rules refuse this m; covered at the m it allows.
  }
  out.push_back({"zb-h1", pl::zero_bubble_h1(p, m, pl::generator_options{small})});
  out.push_back({"zbv", pl::zero_bubble_v(p, m)});
  return out;
}

std::vector<std::size_t> token_counts(int m) {
  std::vector<std::size_t> t;
  for (int i = 0; i < m; ++i) t.push_back(static_cast<std::size_t>(rows_of(i) * head_out));
  return t;
}

void check_equivalence(std::string const& name, pl::schedule const& compute) {
  int const p = compute.num_ranks();
  int const m = compute.num_microbatches();
  int const stages = compute.num_stages();
  CAPTURE(name);
  CAPTURE(p);
  CAPTURE(m);
  auto const lowered = pl::lower(compute);
  pl::validate(lowered);
  data_set const data(m);
  pl::step_options opt;
  opt.tokens = token_counts(m);
  auto const weights = pl::loss_weights(opt, m);

  std::vector<pl::step_result> results(static_cast<std::size_t>(p));
  std::vector<std::vector<std::vector<layer>>> grads(static_cast<std::size_t>(p));
  std::vector<std::vector<int>> stage_ids(static_cast<std::size_t>(p));
  std::vector<std::vector<int>> orders(static_cast<std::size_t>(p));
  std::vector<std::vector<int>> reserved(static_cast<std::size_t>(p));
  weft::test::run_ranks(p, [&](comm::threads::communicator& c) {
    mlp_stage stage(lowered, c.rank(), data);
    auto const r = static_cast<std::size_t>(c.rank());
    results[r] = pl::run_step(lowered, stage, c, opt);
    for (auto& ch : stage.chunks_) {
      stage_ids[r].push_back(ch.stage);
      grads[r].push_back(std::move(ch.layers));
    }
    orders[r] = stage.weight_order;
  });

  auto const ref = sequential_reference(stages, m, weights, data);
  // Loss: on the rank of the last stage only, equal bit for bit.
  int const last_rank = compute.stage_to_rank(stages - 1);
  for (int r = 0; r < p; ++r) {
    auto const& res = results[static_cast<std::size_t>(r)];
    CHECK(res.has_loss == (r == last_rank));
    CHECK(res.timeline.size() == lowered.actions(r).size());
    CHECK(res.metrics.actions == lowered.actions(r).size());
    for (auto const& t : res.timeline) CHECK(t.start <= t.end);
  }
  // One chunk per rank: the stash slots are the simulator's peak in flight.
  if (compute.num_chunks() == 1) {
    auto const sim = pl::simulate(lowered);
    for (int r = 0; r < p; ++r)
      CHECK(results[static_cast<std::size_t>(r)].metrics.slots.at(0) ==
            sim.peak_in_flight[static_cast<std::size_t>(r)]);
  }
  auto const& lr = results[static_cast<std::size_t>(last_rank)];
  CHECK(std::bit_cast<std::uint64_t>(lr.loss) == std::bit_cast<std::uint64_t>(ref.loss));
  CHECK(lr.microbatch_losses.size() == static_cast<std::size_t>(m));
  CHECK(ref.loss > 0.0);
  // Gradients: every parameter of every stage, bit for bit.
  int seen = 0;
  for (int r = 0; r < p; ++r)
    for (std::size_t k = 0; k < stage_ids[static_cast<std::size_t>(r)].size(); ++k) {
      int const s = stage_ids[static_cast<std::size_t>(r)][k];
      auto const& got = grads[static_cast<std::size_t>(r)][k];
      auto const& want = ref.stages[static_cast<std::size_t>(s)];
      REQUIRE(got.size() == want.size());
      for (std::size_t l = 0; l < got.size(); ++l) {
        CAPTURE(s);
        CAPTURE(l);
        CHECK(same_bits(got[l].gw, want[l].gw));
        CHECK(same_bits(got[l].gb, want[l].gb));
      }
      ++seen;
    }
  CHECK(seen == stages);
  // The rule behind the equality: each chunk accumulates in increasing microbatch order.
  for (int r = 0; r < p; ++r) {
    auto const& ord = orders[static_cast<std::size_t>(r)];
    auto const chunks = static_cast<std::size_t>(compute.num_chunks());
    CHECK(ord.size() == chunks * static_cast<std::size_t>(m));
  }
  auto const merged = pl::merge_timelines(results);
  CHECK(merged.ranks.size() == static_cast<std::size_t>(p));
  CHECK(merged.makespan.count() > 0);
}

}  // namespace

TEST_CASE("executor: pipelined loss and gradients equal sequential accumulation bit for bit") {
  int cases = 0;
  for (int p : {1, 2, 4}) {
    std::vector<int> ms = {1, p, 2 * p, 2 * p + 1};
    ms.erase(std::unique(ms.begin(), ms.end()), ms.end());
    for (int m : ms)
      for (auto const& [name, compute] : schedules_for(p, m)) {
        check_equivalence(name, compute);
        ++cases;
      }
  }
  // p = 1: m in {1, 2, 3}, all five generators (15); p = 2 and 4: m in {1, p, 2p, 2p + 1}, all
  // five except interleaved at m = 1 and m = 2p + 1, which Megatron's group rules refuse (18 each).
  MESSAGE("schedules run: ", cases);
  CHECK(cases == 51);
}

TEST_CASE("executor: the sequential reference is not trivially equal (a weight change shows)") {
  // Guards the bitwise test against comparing a model with itself: another loss weighting
  // changes the gradients.
  data_set const data(3);
  pl::step_options a, b;
  a.tokens = token_counts(3);
  b.tokens = a.tokens;
  b.weighting = pl::loss_weighting::microbatch_mean;
  auto const ra = sequential_reference(2, 3, pl::loss_weights(a, 3), data);
  auto const rb = sequential_reference(2, 3, pl::loss_weights(b, 3), data);
  CHECK_FALSE(same_bits(ra.stages[0][0].gw, rb.stages[0][0].gw));
}

TEST_CASE("executor: loss weights follow the global token counts") {
  pl::step_options o;
  o.tokens = {3, 5, 0, 8};
  auto const w = pl::loss_weights(o, 4);
  for (double x : w) CHECK(x == 1.0 / 16.0);
  o.total_tokens = 32.0;  // two data-parallel replicas
  for (double x : pl::loss_weights(o, 4)) CHECK(x == 1.0 / 32.0);
  o.total_tokens = 0.0;
  o.weighting = pl::loss_weighting::microbatch_mean;
  auto const mm = pl::loss_weights(o, 4);
  CHECK(mm[0] == 1.0 / 12.0);
  CHECK(mm[1] == 1.0 / 20.0);
  CHECK(mm[2] == 1.0 / 4.0);  // an empty microbatch counts as one token: no division by 0
  CHECK(mm[3] == 1.0 / 32.0);
  o.tokens = {1, 2};
  CHECK_THROWS_AS(pl::loss_weights(o, 4), weft::invalid_argument_error);
}

TEST_CASE("executor: slots per chunk are the schedule's peak in flight") {
  // 1F1B at p = 4, m = 8 keeps 4, 3, 2, 1 microbatches in flight on ranks 0..3.
  auto const lowered = pl::lower(pl::one_f_one_b(4, 8));
  data_set const data(8);
  for (int r = 0; r < 4; ++r) {
    mlp_stage stage(lowered, r, data);
    auto const plan = pl::prepare_step(lowered, r, stage);
    REQUIRE(plan.slots().size() == 1);
    CHECK(plan.slots()[0] == 4 - r);
    CHECK(stage.reserved_ == 4 - r);
  }
}

TEST_CASE("executor: refuses compute-only, vocabulary and out-of-order schedules") {
  data_set const data(4);
  auto const compute = pl::one_f_one_b(2, 4);
  {
    mlp_stage stage(compute, 0, data);
    CHECK_THROWS_AS(pl::prepare_step(compute, 0, stage), weft::schedule_error);
  }
  // ZB-H1 ends rank 1 with W2, W3; swapping them keeps every dependency but would accumulate
  // microbatch 3's weight gradients before microbatch 2's.
  auto bad = pl::zero_bubble_h1(2, 4);
  auto& prog = bad.actions(1);
  REQUIRE(prog.size() >= 2);
  auto const n = prog.size();
  REQUIRE(prog[n - 2] == bad.make(pl::op::backward_weight, 1, 2));
  REQUIRE(prog[n - 1] == bad.make(pl::op::backward_weight, 1, 3));
  std::swap(prog[n - 2], prog[n - 1]);
  auto const lowered = pl::lower(bad);
  mlp_stage stage(lowered, 1, data);
  try {
    (void)pl::prepare_step(lowered, 1, stage);
    FAIL("expected schedule_error");
  } catch (weft::schedule_error const& e) {
    std::string const what = e.what();
    CHECK(what.find("increasing microbatch order") != std::string::npos);
    CHECK(what.find("rank 1") != std::string::npos);
  }
}

TEST_CASE("executor: a stage that throws on one rank raises on every rank, naming it") {
  using namespace std::chrono_literals;
  constexpr int p = 4;
  constexpr int m = 4;
  auto const deadline = 3000ms;
  for (auto const* where : {"forward", "backward_input"}) {
    CAPTURE(where);
    auto const lowered = pl::lower(pl::one_f_one_b(p, m));
    data_set const data(m);
    std::vector<std::string> messages(p);
    std::vector<int> threw(p, 0);
    auto const t0 = std::chrono::steady_clock::now();
    weft::test::run_ranks(
        p,
        [&](comm::threads::communicator& c) {
          mlp_stage stage(lowered, c.rank(), data);
          stage.fail_at = [&](pl::stage_call const& call, char const* what) {
            return call.stage == 2 && call.microbatch == 1 && std::string(what) == where;
          };
          auto const r = static_cast<std::size_t>(c.rank());
          try {
            (void)pl::run_step(lowered, stage, c, {});
          } catch (std::exception const& e) {
            threw[r] = 1;
            messages[r] = e.what();
          }
        },
        weft::test::test_options(deadline));
    auto const elapsed = std::chrono::steady_clock::now() - t0;
    CHECK(elapsed < deadline + 2s);
    std::string const action = std::string(where) == "forward" ? "`2F1`" : "`2B1`";
    for (int r = 0; r < p; ++r) {
      CAPTURE(r);
      auto const& msg = messages[static_cast<std::size_t>(r)];
      CAPTURE(msg);
      CHECK(threw[static_cast<std::size_t>(r)] == 1);
      CHECK(msg.find("pipeline rank 2") != std::string::npos);
      CHECK(msg.find(action) != std::string::npos);
      CHECK(msg.find("microbatch 1") != std::string::npos);
    }
    CHECK(messages[2].find("injected stage failure") != std::string::npos);
  }
}

TEST_CASE("executor: a reused plan accumulates two steps like two sequential passes") {
  // The executor never touches gradient storage: two steps with one plan add both steps'
  // gradients, equal bit for bit to sequential accumulation over the microbatches twice.
  auto const compute = pl::zero_bubble_v(2, 5);
  auto const lowered = pl::lower(compute);
  int const p = 2, m = 5, stages = compute.num_stages();
  data_set const data(m);
  pl::step_options opt;
  opt.tokens = token_counts(m);
  auto const weights = pl::loss_weights(opt, m);
  std::vector<std::vector<int>> ids(p);
  std::vector<std::vector<std::vector<layer>>> grads(p);
  std::vector<double> losses(p, 0.0);
  weft::test::run_ranks(p, [&](comm::threads::communicator& c) {
    auto const r = static_cast<std::size_t>(c.rank());
    mlp_stage stage(lowered, c.rank(), data);
    auto plan = pl::prepare_step(lowered, c.rank(), stage);
    auto const first = pl::run_step(plan, stage, c, opt);
    auto const second = pl::run_step(plan, stage, c, opt);
    CHECK(first.has_loss == second.has_loss);
    if (second.has_loss) {
      CHECK(std::bit_cast<std::uint64_t>(first.loss) == std::bit_cast<std::uint64_t>(second.loss));
      losses[r] = second.loss;
    }
    for (auto& ch : stage.chunks_) {
      ids[r].push_back(ch.stage);
      grads[r].push_back(std::move(ch.layers));
    }
  });
  auto const once = sequential_reference(stages, m, weights, data);
  auto const twice = sequential_reference(stages, m, weights, data, 2);
  int const last_rank = compute.stage_to_rank(stages - 1);
  CHECK(std::bit_cast<std::uint64_t>(losses[static_cast<std::size_t>(last_rank)]) ==
        std::bit_cast<std::uint64_t>(once.loss));
  for (int r = 0; r < p; ++r)
    for (std::size_t k = 0; k < ids[static_cast<std::size_t>(r)].size(); ++k) {
      int const s = ids[static_cast<std::size_t>(r)][k];
      auto const& got = grads[static_cast<std::size_t>(r)][k];
      auto const& want = twice.stages[static_cast<std::size_t>(s)];
      auto const& one = once.stages[static_cast<std::size_t>(s)];
      for (std::size_t l = 0; l < got.size(); ++l) {
        CHECK(same_bits(got[l].gw, want[l].gw));
        CHECK(same_bits(got[l].gb, want[l].gb));
        CHECK_FALSE(same_bits(got[l].gw, one[l].gw));
      }
    }
}

namespace {

// A stage that only sleeps: what it measures is the executor, not the CPU (ranks outnumber cores).
class sleepy_stage {
 public:
  using stage_concept = pl::stage_tag;
  explicit sleepy_stage(std::chrono::microseconds f, std::chrono::microseconds i,
                        std::chrono::microseconds w)
      : f_(f), i_(i), w_(w) {}
  pl::message_layout input_layout(pl::stage_call const& c) const {
    return {c.first_stage() ? 0u : 4u, weft::dtype::f32};
  }
  pl::message_layout output_layout(pl::stage_call const& c) const {
    return {c.last_stage() ? 0u : 4u, weft::dtype::f32};
  }
  void reserve_slots(int, int) {}
  double forward(pl::stage_call const& c, comm::buffer_view, comm::buffer_view) {
    std::this_thread::sleep_for(f_);
    return c.last_stage() ? c.loss_weight : 0.0;
  }
  void backward_input(pl::stage_call const&, comm::buffer_view, comm::buffer_view) {
    std::this_thread::sleep_for(i_);
  }
  void backward_weight(pl::stage_call const&) { std::this_thread::sleep_for(w_); }

 private:
  std::chrono::microseconds f_, i_, w_;
};
static_assert(pl::Stage<sleepy_stage>);

}  // namespace

TEST_CASE("executor: measured makespan follows the simulation of the measured op times") {
  // The executor adds no scheduling: simulating the lowered schedule with the op times it measured
  // (fit_costs) predicts the measured makespan. Sleeps make the op times independent of load;
  // the tolerance covers thread wake-ups on a loaded machine.
  using namespace std::chrono_literals;
  constexpr int p = 4, m = 8;
  std::vector<case_schedule> const cases = {
      {"1f1b", pl::one_f_one_b(p, m)},
      {"interleaved v2", pl::interleaved_one_f_one_b(p, m, 2)},
      {"zb-h1", pl::zero_bubble_h1(p, m)},
      {"zbv", pl::zero_bubble_v(p, m)}};
  for (auto const& sc : cases) {
    std::string const name = sc.name;
    CAPTURE(name);
    auto const lowered = pl::lower(sc.compute);
    std::vector<pl::step_result> results(p);
    weft::test::run_ranks(p, [&](comm::threads::communicator& c) {
      sleepy_stage stage(2ms, 2ms, 2ms);
      results[static_cast<std::size_t>(c.rank())] = pl::run_step(lowered, stage, c);
    });
    auto const timeline = pl::merge_timelines(results);
    auto const costs = pl::fit_costs(lowered, timeline);
    for (std::size_t s = 0; s < costs.forward.size(); ++s) {
      // A fused B sleeps I then W: each half is at least the 2 ms slept.
      CHECK(costs.forward[s] >= 2.0);
      CHECK(costs.backward_input[s] >= 2.0);
      CHECK(costs.backward_weight[s] >= 2.0);
    }
    auto const measured = pl::as_simulation(lowered, timeline);
    auto const predicted = pl::simulate(lowered, costs);
    MESSAGE(name, ": measured makespan ", measured.makespan, " ms, simulated ", predicted.makespan,
            " ms");
    // The executor cannot beat the dependency graph of its own measured op times. How close it
    // comes (a speed figure, load-dependent) is the benchmark's business, not a test's.
    CHECK(measured.makespan >= 0.95 * predicted.makespan);
    auto const svg = pl::render_measured_svg(lowered, timeline, costs, {name});
    CHECK(svg.find("(simulated)") != std::string::npos);
    CHECK(svg.find("(measured)") != std::string::npos);
  }
}

TEST_CASE("executor: a rank that never runs its step makes every other rank throw at once") {
  using namespace std::chrono_literals;
  constexpr int p = 4;
  auto const deadline = 3000ms;
  auto const lowered = pl::lower(pl::one_f_one_b(p, p));
  data_set const data(p);
  std::vector<int> threw(p, 0);
  std::vector<std::string> messages(p);
  auto const t0 = std::chrono::steady_clock::now();
  weft::test::run_ranks(
      p,
      [&](comm::threads::communicator& c) {
        auto const r = static_cast<std::size_t>(c.rank());
        if (c.rank() == 1) return;  // dies before the step
        mlp_stage stage(lowered, c.rank(), data);
        try {
          (void)pl::run_step(lowered, stage, c);
        } catch (weft::comm_error const& e) {
          threw[r] = 1;
          messages[r] = e.what();
        }
      },
      weft::test::test_options(deadline));
  CHECK(std::chrono::steady_clock::now() - t0 < deadline);
  for (int r = 0; r < p; ++r) {
    if (r == 1) continue;
    CAPTURE(r);
    CAPTURE(messages[static_cast<std::size_t>(r)]);
    CHECK(threw[static_cast<std::size_t>(r)] == 1);
    CHECK(messages[static_cast<std::size_t>(r)].find("rank 1") != std::string::npos);
  }
}

TEST_CASE("executor: layouts that disagree across a stage boundary throw on every rank") {
  using namespace std::chrono_literals;
  constexpr int p = 2;
  auto const lowered = pl::lower(pl::one_f_one_b(p, 2));
  data_set const data(2);
  std::vector<int> threw(p, 0);
  auto const t0 = std::chrono::steady_clock::now();
  weft::test::run_ranks(
      p,
      [&](comm::threads::communicator& c) {
        mlp_stage stage(lowered, c.rank(), data);
        if (c.rank() == 1) stage.input_extra = 1;  // expects one more element than rank 0 sends
        try {
          (void)pl::run_step(lowered, stage, c);
        } catch (weft::comm_error const&) {
          threw[static_cast<std::size_t>(c.rank())] = 1;
        }
      },
      weft::test::test_options(3000ms));
  CHECK(std::chrono::steady_clock::now() - t0 < 3000ms);
  CHECK(threw[0] == 1);
  CHECK(threw[1] == 1);
}

namespace {

// The smallest Stage: every stage adds its own bias to a vector of 4 floats; the last one's loss
// is the weighted sum of the result, so every input gradient is the loss weight.
struct bias_stage {
  using stage_concept = weft::pipeline::stage_tag;
  std::vector<float> bias = std::vector<float>(4, 0.5f), grad = std::vector<float>(4, 0.0f);
  weft::pipeline::message_layout input_layout(weft::pipeline::stage_call const& c) const {
    return {c.first_stage() ? 0u : 4u, weft::dtype::f32};
  }
  weft::pipeline::message_layout output_layout(weft::pipeline::stage_call const& c) const {
    return {c.last_stage() ? 0u : 4u, weft::dtype::f32};
  }
  void reserve_slots(int, int) {}  // nothing to stash: the gradient does not depend on the input
  double forward(weft::pipeline::stage_call const& c, weft::comm::buffer_view in,
                 weft::comm::buffer_view out) {
    double sum = 0.0;
    for (std::size_t k = 0; k < 4; ++k) {
      float const x = (in.empty() ? 1.0f : static_cast<float const*>(in.data)[k]) + bias[k];
      if (out.empty())
        sum += x;
      else
        static_cast<float*>(out.data)[k] = x;
    }
    return c.loss_weight * sum;
  }
  void backward_input(weft::pipeline::stage_call const& c, weft::comm::buffer_view dout,
                      weft::comm::buffer_view din) {
    for (std::size_t k = 0; k < 4 && !din.empty(); ++k)
      static_cast<float*>(din.data)[k] = dout.empty() ? static_cast<float>(c.loss_weight)
                                                      : static_cast<float const*>(dout.data)[k];
    last_dout_ =
        dout.empty() ? static_cast<float>(c.loss_weight) : static_cast<float const*>(dout.data)[0];
  }
  void backward_weight(weft::pipeline::stage_call const&) {
    for (auto& g : grad) g += last_dout_;  // valid here: this stage's dout is the same every time
  }
  float last_dout_ = 0.0f;
};
static_assert(weft::pipeline::Stage<bias_stage>);

}  // namespace

TEST_CASE("executor: the minimal stage of the documentation") {
  // docs: run 1F1B on 2 thread ranks with m = 4 microbatches of one token each.
  namespace pl = weft::pipeline;
  auto const program = pl::lower(pl::one_f_one_b(2, 4));
  std::vector<double> loss(2, 0.0);
  std::vector<std::vector<float>> grads(2);
  weft::comm::threads::run(2, [&](weft::comm::threads::communicator& comm) {
    bias_stage stage;
    auto const result = pl::run_step(program, stage, comm);  // token mean: w = 1/4
    loss[static_cast<std::size_t>(comm.rank())] = result.loss;
    grads[static_cast<std::size_t>(comm.rank())] = stage.grad;
  });
  // Each microbatch: 4 elements of 1 + 0.5 + 0.5, weighted 1/4; summed over 4 microbatches.
  CHECK(loss[1] == doctest::Approx(8.0));
  CHECK(grads[0][0] == doctest::Approx(1.0f));  // 4 microbatches x w = 1/4
  CHECK(grads[1][3] == doctest::Approx(1.0f));
}

// ---- vocabulary parallelism: the balanced schedules with sharded embedding and output layer ----

namespace {

constexpr int vocab_size = 12;  // divisible by 1, 2, 3 and 4 ranks

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
// cross-entropy per token, microbatches in order.
struct vocab_reference_result {
  double loss = 0.0;
  std::vector<std::vector<layer>> stages;
  vocab_tables tables{0, vocab_size};
};

vocab_reference_result vocab_reference(int stages, int m, std::vector<double> const& weights,
                                       vocab_data const& vd) {
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
    for (int t = 0; t < n; ++t) {
      float const* xt = x.data() + t * width;
      tb.logits(xt, y);
      double const mx = *std::max_element(y.begin(), y.end());
      double s = 0.0;
      for (float v : y) s += std::exp(static_cast<double>(v) - mx);
      int const target = tg[static_cast<std::size_t>(t)];
      res.loss +=
          w * (std::log(s) - (static_cast<double>(y[static_cast<std::size_t>(target)]) - mx));
      for (int v = 0; v < vocab_size; ++v) {
        double const pr = std::exp(static_cast<double>(y[static_cast<std::size_t>(v)]) - mx) / s;
        auto const d = static_cast<float>(w * (pr - (v == target ? 1.0 : 0.0)));
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
bool close(std::vector<float> const& a, std::vector<float> const& b) {
  if (a.size() != b.size()) return false;
  double scale = 0.0, diff = 0.0;
  for (std::size_t k = 0; k < a.size(); ++k) {
    scale = std::max(scale, std::abs(static_cast<double>(b[k])));
    diff = std::max(diff, std::abs(static_cast<double>(a[k]) - static_cast<double>(b[k])));
  }
  return diff <= 1e-5 * scale + 1e-7;
}

void check_vocab(pl::vocab_variant variant, int p, int m) {
  CAPTURE(pl::to_string(variant));
  CAPTURE(p);
  CAPTURE(m);
  // m < p only breaks the generator's performance rule; validate still proves the program.
  pl::vocab_options vo;
  vo.unchecked = m < p;
  auto const compute = pl::vocab_one_f_one_b(p, m, variant, vo);
  auto const lowered = pl::lower(compute);
  pl::validate(lowered);
  int const stages = compute.num_stages();
  data_set const data(m);
  vocab_data const vd(m);
  pl::step_options opt;
  opt.tokens.clear();
  for (int i = 0; i < m; ++i) opt.tokens.push_back(static_cast<std::size_t>(rows_of(i)));
  auto const weights = pl::loss_weights(opt, m);
  // Two barriers: no counts given, so the executor weights by the shard's tokens(c), which are
  // the same counts.
  pl::step_options run_opt = opt;
  if (variant == pl::vocab_variant::two_barrier) run_opt.tokens.clear();
  std::vector<pl::step_result> results(static_cast<std::size_t>(p));
  std::vector<std::vector<int>> ids(static_cast<std::size_t>(p));
  std::vector<std::vector<std::vector<layer>>> grads(static_cast<std::size_t>(p));
  std::vector<std::optional<vocab_tables>> shards(static_cast<std::size_t>(p));
  weft::test::run_ranks(p, [&](comm::threads::communicator& c) {
    auto vc = c.split(0, c.rank());  // the vocabulary channel, built up front
    auto const r = static_cast<std::size_t>(c.rank());
    mlp_stage stage(lowered, c.rank(), data, true);
    vocab_shard shard(c.rank(), p, vd);
    auto plan = pl::prepare_step(lowered, c.rank(), stage, shard);
    results[r] = pl::run_step(plan, stage, shard, c, vc, run_opt);
    for (auto& ch : stage.chunks_) {
      ids[r].push_back(ch.stage);
      grads[r].push_back(std::move(ch.layers));
    }
    shards[r] = std::move(shard.tables_);
  });
  auto const ref = vocab_reference(stages, m, weights, vd);
  int const last_rank = compute.stage_to_rank(stages - 1);
  auto const& lr = results[static_cast<std::size_t>(last_rank)];
  CHECK(lr.has_loss);
  CHECK(lr.loss == doctest::Approx(ref.loss).epsilon(1e-5));
  CHECK(ref.loss > 0.0);
  for (int r = 0; r < p; ++r) {
    auto const ur = static_cast<std::size_t>(r);
    for (std::size_t k = 0; k < ids[ur].size(); ++k) {
      int const s = ids[ur][k];
      CAPTURE(s);
      auto const& want = ref.stages[static_cast<std::size_t>(s)];
      for (std::size_t l = 0; l < want.size(); ++l) {
        CAPTURE(l);
        CHECK(close(grads[ur][k][l].gw, want[l].gw));
        CHECK(close(grads[ur][k][l].gb, want[l].gb));
      }
    }
    // Each shard's rows equal the reference's rows of the same vocabulary range.
    auto const& sh = *shards[ur];
    auto const first = static_cast<std::size_t>(sh.lo * width);
    auto const count = static_cast<std::size_t>((sh.hi - sh.lo) * width);
    std::vector<float> ref_ge(ref.tables.ge.begin() + static_cast<std::ptrdiff_t>(first),
                              ref.tables.ge.begin() + static_cast<std::ptrdiff_t>(first + count));
    std::vector<float> ref_gw(ref.tables.gw.begin() + static_cast<std::ptrdiff_t>(first),
                              ref.tables.gw.begin() + static_cast<std::ptrdiff_t>(first + count));
    CAPTURE(r);
    CHECK(close(sh.ge, ref_ge));
    CHECK(close(sh.gw, ref_gw));
  }
}

}  // namespace

TEST_CASE("executor: vocabulary-balanced schedules match the single-device model") {
  // Against reference B with fp32 tolerances only: the online rescaling of C0 associates the
  // softmax sums differently (reference note section 2.6).
  for (auto variant : {pl::vocab_variant::one_barrier, pl::vocab_variant::two_barrier})
    for (int p : {2, 4})
      for (int m : {1, p, 2 * p + 1}) check_vocab(variant, p, m);
}

TEST_CASE("executor: a vocabulary pass that throws on one rank raises on every rank") {
  using namespace std::chrono_literals;
  constexpr int p = 4, m = 4;
  auto const deadline = 3000ms;
  auto const lowered = pl::lower(pl::vocab_one_f_one_b(p, m, pl::vocab_variant::one_barrier));
  data_set const data(m);
  vocab_data const vd(m);
  std::vector<std::string> messages(p);
  auto const t0 = std::chrono::steady_clock::now();
  weft::test::run_ranks(
      p,
      [&](comm::threads::communicator& c) {
        auto vc = c.split(0, c.rank());
        mlp_stage stage(lowered, c.rank(), data, true);
        vocab_shard shard(c.rank(), p, vd);
        shard.fail_at = [](pl::stage_call const& call) {
          return call.stage == 3 && call.microbatch == 2;
        };
        auto plan = pl::prepare_step(lowered, c.rank(), stage, shard);
        try {
          (void)pl::run_step(plan, stage, shard, c, vc);
        } catch (std::exception const& e) {
          messages[static_cast<std::size_t>(c.rank())] = e.what();
        }
      },
      weft::test::test_options(deadline));
  CHECK(std::chrono::steady_clock::now() - t0 < deadline + 2s);
  for (int r = 0; r < p; ++r) {
    auto const& msg = messages[static_cast<std::size_t>(r)];
    CAPTURE(r);
    CAPTURE(msg);
    CHECK(msg.find("pipeline rank 3") != std::string::npos);
    CHECK(msg.find("`3S2`") != std::string::npos);
    CHECK(msg.find("microbatch 2") != std::string::npos);
  }
}

TEST_SUITE_END();
