// benchmarks/pipeline.bench.cpp — the pipeline executor against the simulator: every schedule weft
// generates (GPipe, 1F1B, interleaved 1F1B v = 2, ZB-H1, ZBV, vocabulary-balanced 1F1B with one
// and two barriers, their collectives overlapped and, the `_blocking` rows, blocking) on p = 4
// thread ranks at m = 8 and 16, with stages that sleep a fixed time per action, so that 4 ranks
// fit 2 cores and the figures measure the executor, not the CPU.
//
// Every program is lowered for the executor (lower(s, replay_model::executor()): messages placed
// by time where that is valid for it; for the vocabulary schedules it is, where the rendezvous
// lowering is not); bm_step's under the sleeps as costs, the others under the unit model.
// bm_step (UseManualTime): one step per iteration; the time charged is the executed makespan, from
// the first compute start to the last compute end over all ranks (as_simulation of the merged
// timeline, the quantity simulate() calls makespan). Counters (means over the iterations):
//   simulated_ms  simulate(lowered, costs): the program the executor ran, timed in program order,
//                 with the sleeps as costs and the collectives blocking (the `_blocking` rows) or
//                 on a stream of their own (overlapped)
//   executed_ms   the measured makespan;  ratio = executed_ms / simulated_ms
//   design_ms     simulate(compute-only schedule, same costs) with the collectives on a stream of
//                 their own, the makespan the schedule was designed for; design_ratio likewise
//   fitted_ratio  executed_ms / simulate(lowered, fit_costs(measured)): the same program under
//                 the op times the run measured (sleeps overshoot by the timer's wake-up latency)
//   excess_us_per_action  (executed - simulated) / actions of the longest rank program
// bm_overhead: the same steps with stages that do nothing; overhead_us_per_action = the slowest
// rank's step time / its number of actions (SEND/RECV and collectives included), the executor's
// own cost per action (thread hand-offs through the threads backend included).
//
// Sleeps: F = 2 ms, I = W = 2 ms (B = 4 ms) per stage or chunk, S = 1 ms and T = 0.5 ms per rank
// (the vocabulary generator's planning ratios), IF and IB free. Each rank thread sets its timer
// slack to 1 ns (Linux), so a 2 ms sleep overshoots by the wake-up latency only (~30-60 us on the
// shared VM; the default 50 us slack doubles that). Figures and commands: benchmarks/RESULTS.md.
// bm_gpt: one training step's forward and backward of a real GPT (parallel::gpt over pp = 2
// thread ranks: 4 blocks, d 256, 4 heads, MLP 1024, vocabulary 1024, 8 microbatches of one
// 128-token sequence; f32) under each one- and two-chunk schedule, the zero-bubble ones also
// with every backward fused (split:0, the stage before its split backward, where a W does
// nothing): time = the slowest rank's step; counters fitted_ms (simulate(lowered,
// fit_costs(measured)): the program under the op times this run measured) and i_ms, w_ms (the mean
// measured I and W of the split schedules). Two ranks on two cores; run with
// OPENBLAS_NUM_THREADS=1. bm_gpt_vocab: the same step on a GPT whose output layer dominates (2
// blocks, d 256, vocabulary 16384, so the last stage's head is about twice its blocks' work), under
// 1F1B (embedding on stage 0, head on stage 1) and the vocabulary-balanced 1F1B with one and two
// barriers (both sharded over the 2 ranks: gpt_vocab_shard), their collectives overlapped (the
// default) or blocking (overlap:0), on one rank a stage or (tp:2) on two tp ranks a stage with
// sequence parallelism (4 threads on the 2 cores: compare its rows with each other, not with
// tp:1's); time = the slowest rank's step,
// counters loss (the step's cross-entropy, the same for the three), compute0_ms, compute1_ms
// (each rank's time in stage calls and vocabulary passes: the balance) and the fitted
// per-microbatch times of the last stage's F and B and of S and T (fit_costs). bm_search:
// search::search_schedule at p = 8, m = 32 (the bound: under 10 s) with non-uniform stage
// costs, a p2p latency and a memory limit of 2p-1 microbatches per rank (arg 1) or none (arg 0);
// counters makespan, best_hand (ZB-H1 there) and gain_pct.
//   weft.bench.pipeline --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
#include <weft/comm/threads/world.hpp>
#include <weft/mesh/device_mesh.hpp>
#include <weft/nn/gpt.hpp>
#include <weft/parallel/gpt_pipeline.hpp>
#include <weft/parallel/gpt_vocab.hpp>
#include <weft/pipeline/pipeline.hpp>

#include <benchmark/benchmark.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#if defined(__linux__)
#include <sys/prctl.h>
#endif

namespace {

namespace pl = weft::pipeline;
namespace wc = weft::comm;
using ms = std::chrono::duration<double, std::milli>;

constexpr int ranks = 4;

// Sleep per action, in ms (0 = return at once).
struct sleeps {
  double f = 0, i = 0, w = 0, s = 0, t = 0;
};
constexpr sleeps timed{2.0, 2.0, 2.0, 1.0, 0.5};
constexpr sleeps none{};

void nap(double milliseconds) {
  if (milliseconds > 0) std::this_thread::sleep_for(ms(milliseconds));
}

// A stage that only sleeps. Messages are 4 floats; under vocabulary parallelism stage 0's input and
// the last stage's output are the n x h = 1 x 4 embedding.
class sleepy_stage {
 public:
  using stage_concept = pl::stage_tag;
  sleepy_stage(sleeps d, bool vocab) : d_(d), vocab_(vocab) {}
  pl::message_layout input_layout(pl::stage_call const& c) const {
    return {c.first_stage() && !vocab_ ? 0u : 4u, weft::dtype::f32};
  }
  pl::message_layout output_layout(pl::stage_call const& c) const {
    return {c.last_stage() && !vocab_ ? 0u : 4u, weft::dtype::f32};
  }
  void reserve_slots(int, int) {}
  double forward(pl::stage_call const& c, wc::buffer_view, wc::buffer_view) {
    nap(d_.f);
    return c.last_stage() ? c.loss_weight : 0.0;
  }
  void backward_input(pl::stage_call const&, wc::buffer_view, wc::buffer_view) { nap(d_.i); }
  void backward_weight(pl::stage_call const&) { nap(d_.w); }

 private:
  sleeps d_;
  bool vocab_;
};
static_assert(pl::Stage<sleepy_stage>);

// A vocabulary shard whose S and T sleep; one token per microbatch, h = 4. S writes statistics of
// a uniform softmax (max 0, sum of exponentials 1), so C0's loss stays finite.
class sleepy_shard {
 public:
  using vocab_concept = pl::vocab_tag;
  explicit sleepy_shard(sleeps d) : d_(d) {}
  std::size_t tokens(pl::stage_call const&) const { return 1; }
  std::size_t hidden() const { return 4; }
  void input_forward(pl::stage_call const&, wc::buffer_view) {}
  void input_backward(pl::stage_call const&, wc::buffer_view) {}
  void output_forward(pl::stage_call const&, wc::buffer_view, wc::buffer_view stats) {
    nap(d_.s);
    auto* st = static_cast<float*>(stats.data);
    std::fill(st, st + stats.count, 0.0f);
    st[1] = 1.0f;  // [max | sumexp | target | ...] for n = 1
  }
  void output_backward(pl::stage_call const&, wc::buffer_view, wc::buffer_view, wc::buffer_view,
                       wc::buffer_view, wc::buffer_view) {
    nap(d_.t);
  }

 private:
  sleeps d_;
};
static_assert(pl::VocabShard<sleepy_shard>);

enum class kind {
  gpipe,
  one_f_one_b,
  interleaved,
  zb_h1,
  zbv,
  vocab_1,
  vocab_2,
  zb_h2,
  dualpipe_v,
  vocab_1_blocking,  // the same schedules with step_options::vocab_overlap off
  vocab_2_blocking
};
constexpr kind all_kinds[] = {kind::gpipe,           kind::one_f_one_b,
                              kind::interleaved,     kind::zb_h1,
                              kind::zb_h2,           kind::zbv,
                              kind::dualpipe_v,      kind::vocab_1,
                              kind::vocab_2,         kind::vocab_1_blocking,
                              kind::vocab_2_blocking};

// The vocabulary collectives run blocking where they stand (else overlapped, the default).
bool blocking(kind k) { return k == kind::vocab_1_blocking || k == kind::vocab_2_blocking; }

char const* name_of(kind k) {
  switch (k) {
    case kind::gpipe: return "gpipe";
    case kind::one_f_one_b: return "1f1b";
    case kind::interleaved: return "interleaved_v2";
    case kind::zb_h1: return "zb_h1";
    case kind::zb_h2: return "zb_h2";
    case kind::zbv: return "zbv";
    case kind::dualpipe_v: return "dualpipe_v";
    case kind::vocab_1: return "vocab_1barrier";
    case kind::vocab_2: return "vocab_2barrier";
    case kind::vocab_1_blocking: return "vocab_1barrier_blocking";
    case kind::vocab_2_blocking: return "vocab_2barrier_blocking";
  }
  return "?";
}

pl::schedule make(kind k, int m) {
  switch (k) {
    case kind::gpipe: return pl::gpipe(ranks, m);
    case kind::one_f_one_b: return pl::one_f_one_b(ranks, m);
    case kind::interleaved: return pl::interleaved_one_f_one_b(ranks, m, 2);
    case kind::zb_h1: return pl::zero_bubble_h1(ranks, m);
    case kind::zb_h2: return pl::zero_bubble_h2(ranks, m);
    case kind::zbv: return pl::zero_bubble_v(ranks, m);
    case kind::dualpipe_v: return pl::dualpipe_v(ranks, m);
    case kind::vocab_1:
    case kind::vocab_1_blocking:
      return pl::vocab_one_f_one_b(ranks, m, pl::vocab_variant::one_barrier);
    case kind::vocab_2:
    case kind::vocab_2_blocking:
      return pl::vocab_one_f_one_b(ranks, m, pl::vocab_variant::two_barrier);
  }
  return {};
}

// The sleeps as a cost model, in ms.
pl::cost_model costs_of(pl::schedule const& s, sleeps d, bool collectives_block) {
  pl::cost_model c;
  auto const n = static_cast<std::size_t>(s.num_stages());
  c.forward.assign(n, d.f);
  c.backward_input.assign(n, d.i);
  c.backward_weight.assign(n, d.w);
  if (s.vocab() != pl::vocab_variant::none) {
    c.vocab_forward = d.s;
    c.vocab_backward = d.t;
  }
  c.collectives_block = collectives_block;
  return c;
}

// One step on `ranks` thread ranks; the vocabulary collectives get a channel of their own.
std::vector<pl::step_result> run_once(pl::schedule const& lowered, sleeps d, bool overlap = true) {
  std::vector<pl::step_result> results(ranks);
  bool const vocab = lowered.vocab() != pl::vocab_variant::none;
  wc::threads::world(ranks).run([&](wc::threads::communicator& c) {
#if defined(__linux__)
    prctl(PR_SET_TIMERSLACK, 1UL, 0UL, 0UL, 0UL);
#endif
    sleepy_stage stage(d, vocab);
    auto& out = results[static_cast<std::size_t>(c.rank())];
    if (vocab) {
      auto vc = c.split(0, c.rank());
      sleepy_shard shard(d);
      auto plan = pl::prepare_step(lowered, c.rank(), stage, shard);
      pl::step_options so;
      so.vocab_overlap = overlap;
      out = pl::run_step(plan, stage, shard, c, vc, so);
    } else {
      auto plan = pl::prepare_step(lowered, c.rank(), stage);
      out = pl::run_step(plan, stage, c);
    }
  });
  return results;
}

std::size_t longest_program(pl::schedule const& s) {
  std::size_t n = 0;
  for (int r = 0; r < s.num_ranks(); ++r) n = std::max(n, s.actions(r).size());
  return n;
}

void bm_step(benchmark::State& state) {
  auto const k = static_cast<kind>(state.range(0));
  int const m = static_cast<int>(state.range(1));
  auto const compute = make(k, m);
  // Lowered for the costs it runs under (the sleeps), as lower() advises.
  auto const lowered =
      pl::lower(compute, costs_of(compute, timed, false), pl::replay_model::executor());
  bool const overlap = !blocking(k);
  double const simulated = pl::simulate(lowered, costs_of(lowered, timed, !overlap)).makespan;
  double const design = pl::simulate(compute, costs_of(compute, timed, false)).makespan;
  double executed = 0.0, fitted = 0.0;
  (void)run_once(lowered, timed, overlap);  // warm-up: first thread start-ups and page faults
  for (auto _ : state) {
    auto const results = run_once(lowered, timed, overlap);
    auto const timeline = pl::merge_timelines(results);
    double const made = pl::as_simulation(lowered, timeline).makespan;
    executed += made;
    fitted += pl::simulate(lowered, pl::fit_costs(lowered, timeline)).makespan;
    state.SetIterationTime(made * 1e-3);
  }
  auto const n = static_cast<double>(state.iterations());
  executed /= n;
  fitted /= n;
  state.SetLabel(std::string(name_of(k)) + " m=" + std::to_string(m));
  state.counters["simulated_ms"] = simulated;
  state.counters["executed_ms"] = executed;
  state.counters["ratio"] = executed / simulated;
  state.counters["design_ms"] = design;
  state.counters["design_ratio"] = executed / design;
  state.counters["fitted_ratio"] = executed / fitted;
  state.counters["excess_us_per_action"] =
      (executed - simulated) * 1e3 / static_cast<double>(longest_program(lowered));
}

void bm_overhead(benchmark::State& state) {
  auto const k = static_cast<kind>(state.range(0));
  int const m = static_cast<int>(state.range(1));
  auto const lowered = pl::lower(make(k, m), pl::replay_model::executor());
  double per_action = 0.0;
  (void)run_once(lowered, none, !blocking(k));
  for (auto _ : state) {
    auto const results = run_once(lowered, none, !blocking(k));
    std::chrono::nanoseconds slowest{0};
    std::size_t actions = 0;
    for (auto const& r : results) {
      slowest = std::max(slowest, r.metrics.step);
      actions = std::max(actions, r.metrics.actions);
    }
    double const us = std::chrono::duration<double, std::micro>(slowest).count();
    per_action += us / static_cast<double>(actions);
    state.SetIterationTime(us * 1e-6);
  }
  state.SetLabel(std::string(name_of(k)) + " m=" + std::to_string(m));
  state.counters["overhead_us_per_action"] = per_action / static_cast<double>(state.iterations());
  state.counters["actions"] = static_cast<double>(longest_program(lowered));
}

void schedules(benchmark::internal::Benchmark* b) {
  b->ArgNames({"schedule", "m"});
  for (kind k : all_kinds)
    for (int m : {8, 16}) b->Args({static_cast<long>(k), m});
}

// Non-uniform F, I, W per stage (as tests/pipeline/search.test.cpp's grid) and p2p 0.25.
void bm_search(benchmark::State& state) {
  int const p = 8, m = 32;
  pl::cost_model c;
  for (int r = 0; r < p; ++r) {
    c.forward.push_back(0.6 + 0.1 * ((r * 5 + 2) % 11));
    c.backward_input.push_back(0.7 + 0.15 * ((r * 3 + 1) % 7));
    c.backward_weight.push_back(0.3 + 0.1 * ((r * 7 + 3) % 9));
    c.activation_bytes.push_back(1.0);
    c.parameter_bytes.push_back(0.0);
  }
  c.p2p_latency = 0.25;
  pl::search::search_options o;
  if (state.range(0) != 0) o.memory_limit.assign(static_cast<std::size_t>(p), 2.0 * p - 1);
  double makespan = 0, hand = 0, candidates = 0, evaluations = 0;
  for (auto _ : state) {
    auto const res = pl::search::search_schedule(p, m, c, o);
    makespan = res.makespan;
    hand = res.best_hand_makespan;
    candidates = res.candidates;
    evaluations = res.evaluations;
    benchmark::ClobberMemory();
  }
  state.counters["makespan"] = makespan;
  state.counters["best_hand"] = hand;
  state.counters["gain_pct"] = 100.0 * (1.0 - makespan / hand);
  state.counters["candidates"] = candidates;
  state.counters["evaluations"] = evaluations;
}

// ---- a real GPT under the schedules -------------------------------------------------------------

enum class gpt_kind { one_f_one_b, zb_h1, zb_h2, interleaved, zbv, dualpipe_v };
constexpr gpt_kind gpt_kinds[] = {gpt_kind::one_f_one_b, gpt_kind::zb_h1, gpt_kind::zb_h2,
                                  gpt_kind::interleaved, gpt_kind::zbv,   gpt_kind::dualpipe_v};

char const* gpt_name(gpt_kind k) {
  switch (k) {
    case gpt_kind::one_f_one_b: return "1f1b";
    case gpt_kind::zb_h1: return "zb_h1";
    case gpt_kind::zb_h2: return "zb_h2";
    case gpt_kind::interleaved: return "interleaved_v2";
    case gpt_kind::zbv: return "zbv";
    case gpt_kind::dualpipe_v: return "dualpipe_v";
  }
  return "?";
}

pl::schedule gpt_schedule(gpt_kind k, int p, int m) {
  switch (k) {
    case gpt_kind::one_f_one_b: return pl::one_f_one_b(p, m);
    case gpt_kind::zb_h1: return pl::zero_bubble_h1(p, m);
    case gpt_kind::zb_h2: return pl::zero_bubble_h2(p, m);
    case gpt_kind::interleaved: return pl::interleaved_one_f_one_b(p, m, 2);
    case gpt_kind::zbv: return pl::zero_bubble_v(p, m);
    case gpt_kind::dualpipe_v: return pl::dualpipe_v(p, m);
  }
  return {};
}

// The GPT stage as it was before its backward was split: every backward action runs the fused
// backward (a split schedule's I does all the work, its W nothing), the baseline of bm_gpt's
// split:0 rows.
template <class S>
class fused_only {
 public:
  using stage_concept = pl::stage_tag;
  explicit fused_only(S& s) : s_(&s) {}
  pl::message_layout input_layout(pl::stage_call const& c) const { return s_->input_layout(c); }
  pl::message_layout output_layout(pl::stage_call const& c) const { return s_->output_layout(c); }
  void reserve_slots(int chunk, int slots) { s_->reserve_slots(chunk, slots); }
  double forward(pl::stage_call const& c, wc::buffer_view in, wc::buffer_view out) {
    return s_->forward(c, in, out);
  }
  void backward_input(pl::stage_call const& c, wc::buffer_view dout, wc::buffer_view din) {
    s_->backward(c, dout, din);
  }
  void backward_weight(pl::stage_call const&) {}

 private:
  S* s_;
};

void bm_gpt(benchmark::State& state) {
  namespace par = weft::parallel;
  namespace nn = weft::nn;
  using comm_t = wc::threads::communicator;
  auto const k = static_cast<gpt_kind>(state.range(0));
  bool const split = state.range(1) != 0;
  constexpr int p = 2, m = 8, seq = 128;
  nn::gpt_config c;
  c.vocab = 1024;
  c.context = seq;
  c.d_model = 256;
  c.heads = 4;
  c.layers = 4;
  c.mlp_hidden = 1024;
  std::vector<std::int32_t> tokens, targets;
  for (int i = 0; i < m * seq; ++i) {
    tokens.push_back(static_cast<std::int32_t>((i * 37 + 11) % c.vocab));
    targets.push_back(static_cast<std::int32_t>((i * 53 + 7) % c.vocab));
  }
  auto const compute = gpt_schedule(k, p, m);
  auto const lowered = pl::lower(compute, pl::replay_model::executor());
  // Per rank: its chunks' stores and the stage, built once (the first step allocates).
  struct rank_state {
    std::vector<nn::param_store<float>> stores;
    std::unique_ptr<par::gpt_pipeline_chunks<float, comm_t, comm_t>> stage;
  };
  std::vector<pl::step_result> results(p);
  double fitted = 0.0, i_ms = 0.0, w_ms = 0.0;
  int steps = 0;
  auto const microbatch = [&](int i) {
    auto const at = static_cast<std::size_t>(i * seq);
    return par::gpt_sequences{std::span<std::int32_t const>(tokens).subspan(at, seq),
                              std::span<std::int32_t const>(targets).subspan(at, seq), seq};
  };
  std::vector<double> step_ms;
  // All the steps run inside one world, so the thread start-ups are not timed.
  int const iterations = static_cast<int>(state.max_iterations);
  wc::threads::world(p).run([&](comm_t& pp) {
    auto solo = pp.split(pp.rank(), 0);
    auto const chunks = par::gpt_chunks(par::gpt_parallelism{}, compute, pp.rank());
    rank_state rs;
    rs.stores.reserve(chunks.size());
    std::vector<nn::param_store<float>*> ptrs;
    for (auto const& q : chunks) {
      rs.stores.emplace_back(par::gpt_shard_layout(c, q));
      par::gpt_init_shard(rs.stores.back(), c, q, 1);
      ptrs.push_back(&rs.stores.back());
    }
    rs.stage = std::make_unique<par::gpt_pipeline_chunks<float, comm_t, comm_t>>(
        c, chunks, solo, solo, ptrs, microbatch);
    fused_only<par::gpt_pipeline_chunks<float, comm_t, comm_t>> fused(*rs.stage);
    auto plan = split ? pl::prepare_step(lowered, pp.rank(), *rs.stage)
                      : pl::prepare_step(lowered, pp.rank(), fused);
    pl::step_options so;
    so.total_tokens = static_cast<double>(m * seq);
    for (int it = 0; it <= iterations; ++it) {  // the first step warms up, untimed
      for (auto& s : rs.stores) s.zero_grad();
      results[static_cast<std::size_t>(pp.rank())] =
          split ? pl::run_step(plan, *rs.stage, pp, so) : pl::run_step(plan, fused, pp, so);
      pp.barrier().wait();
      if (pp.rank() == 0 && it > 0) {
        std::chrono::nanoseconds slowest{0};
        for (auto const& r : results) slowest = std::max(slowest, r.metrics.step);
        step_ms.push_back(std::chrono::duration<double, std::milli>(slowest).count());
        auto const timeline = pl::merge_timelines(results);
        fitted += pl::simulate(lowered, pl::fit_costs(lowered, timeline)).makespan;
        auto const costs = pl::fit_costs(lowered, timeline);
        i_ms += costs.backward_input.front();
        w_ms += costs.backward_weight.front();
        ++steps;
      }
      pp.barrier().wait();
    }
  });
  std::size_t next = 0;
  for (auto _ : state) state.SetIterationTime(step_ms.at(next++) * 1e-3);
  state.SetLabel(std::string(gpt_name(k)) + (split ? "" : " fused") + " p=2 m=8");
  state.counters["fitted_ms"] = fitted / steps;
  state.counters["i_ms"] = i_ms / steps;
  state.counters["w_ms"] = w_ms / steps;
}

// 1F1B against the vocabulary-balanced 1F1B (arg vocab: 0 = 1F1B, 1 = one barrier, 2 = two
// barriers; arg overlap: the vocabulary collectives overlapped, the default, or blocking; arg tp:
// each stage over tp ranks, with sequence parallelism where tp > 1) on a GPT whose output layer
// outweighs its blocks.
void bm_gpt_vocab(benchmark::State& state) {
  namespace par = weft::parallel;
  namespace nn = weft::nn;
  using comm_t = wc::threads::communicator;
  int const kind = static_cast<int>(state.range(0));
  bool const overlap = state.range(1) != 0;
  int const tp = static_cast<int>(state.range(2));
  constexpr int p = 2, m = 8, seq = 128;
  nn::gpt_config c;
  c.vocab = 16384;
  c.context = seq;
  c.d_model = 256;
  c.heads = 4;
  c.layers = 2;
  c.mlp_hidden = 1024;
  std::vector<std::int32_t> tokens, targets;
  for (int i = 0; i < m * seq; ++i) {
    tokens.push_back(static_cast<std::int32_t>((i * 37 + 11) % c.vocab));
    targets.push_back(static_cast<std::int32_t>((i * 53 + 7) % c.vocab));
  }
  auto const variant = kind == 1 ? pl::vocab_variant::one_barrier : pl::vocab_variant::two_barrier;
  auto const lowered =
      pl::lower(kind == 0 ? pl::one_f_one_b(p, m) : pl::vocab_one_f_one_b(p, m, variant),
                pl::replay_model::executor());
  auto const microbatch = [&](int i) {
    auto const at = static_cast<std::size_t>(i * seq);
    return par::gpt_sequences{std::span<std::int32_t const>(tokens).subspan(at, seq),
                              std::span<std::int32_t const>(targets).subspan(at, seq), seq};
  };
  std::vector<pl::step_result> results(static_cast<std::size_t>(p * tp));  // by world rank
  std::vector<double> step_ms;
  std::array<double, p> busy{};  // each pipeline rank's (tp rank 0) time in stage calls and passes
  double f_last = 0, b_last = 0, s_ms = 0, t_ms = 0;  // fitted per-microbatch pass times
  double loss = 0.0;
  int const iterations = static_cast<int>(state.max_iterations);
  wc::threads::world(p * tp).run([&](comm_t& world) {
    weft::device_mesh<comm_t> mesh(world, {p, tp}, {"pp", "tp"});
    auto& pp = mesh.group("pp");
    auto& tpg = mesh.group("tp");
    auto solo = world.split(world.rank(), 0);
    auto vc = pp.split(0, pp.rank());
    par::gpt_parallelism const q{tp, tpg.rank(), tp > 1, 1, 0, p, pp.rank(), kind != 0};
    nn::param_store<float> store(par::gpt_shard_layout(c, q));
    par::gpt_init_shard(store, c, q, 1);
    std::optional<nn::param_store<float>> vocab;
    std::optional<par::gpt_vocab_shard<float, comm_t>> shard;
    if (kind != 0) {
      vocab.emplace(par::gpt_vocab_layout(c, q));
      par::gpt_vocab_init(*vocab, c, q, 1);
      shard.emplace(c, q, tpg, *vocab, microbatch);
    }
    par::gpt_pipeline_stage<float, comm_t, comm_t> stage(c, q, tpg, solo, store, microbatch);
    auto plan = kind == 0 ? pl::prepare_step(lowered, pp.rank(), stage)
                          : pl::prepare_step(lowered, pp.rank(), stage, *shard);
    pl::step_options so;
    so.total_tokens = static_cast<double>(m * seq);  // the mean cross-entropy (every target counts)
    so.vocab_overlap = overlap;
    for (int it = 0; it <= iterations; ++it) {  // the first step warms up, untimed
      store.zero_grad();
      if (vocab) vocab->zero_grad();
      auto& r = results[static_cast<std::size_t>(world.rank())];
      r = kind == 0 ? pl::run_step(plan, stage, pp, so)
                    : pl::run_step(plan, stage, *shard, pp, vc, so);
      world.barrier().wait();
      if (world.rank() == 0 && it > 0) {
        std::chrono::nanoseconds slowest{0};
        std::vector<pl::step_result> column;  // tp rank 0's pipeline
        for (std::size_t w = 0; w < results.size(); ++w) {
          auto const& x = results[w];
          slowest = std::max(slowest, x.metrics.step);
          if (x.has_loss) loss = x.loss;
          if (w % static_cast<std::size_t>(tp) != 0) continue;
          column.push_back(x);
          busy[static_cast<std::size_t>(x.rank)] +=
              std::chrono::duration<double, std::milli>(x.metrics.compute).count();
        }
        step_ms.push_back(std::chrono::duration<double, std::milli>(slowest).count());
        auto const costs = pl::fit_costs(lowered, pl::merge_timelines(column));
        f_last += costs.forward.back();
        b_last += costs.backward_input.back() + costs.backward_weight.back();
        s_ms += costs.vocab_forward;
        t_ms += costs.vocab_backward;
      }
      world.barrier().wait();
    }
  });
  std::size_t next = 0;
  for (auto _ : state) state.SetIterationTime(step_ms.at(next++) * 1e-3);
  auto const steps = static_cast<double>(step_ms.size());
  state.counters["f_last_ms"] = f_last / steps;
  state.counters["b_last_ms"] = b_last / steps;
  state.counters["s_ms"] = s_ms / steps;
  state.counters["t_ms"] = t_ms / steps;
  state.SetLabel((kind == 0 ? std::string("1f1b")
                            : std::string(kind == 1 ? "vocab 1-barrier" : "vocab 2-barrier") +
                                  (overlap ? " overlapped" : " blocking")) +
                 " p=2 m=8 V=16384" + (tp > 1 ? " tp=" + std::to_string(tp) + " +SP" : ""));
  state.counters["compute0_ms"] = busy[0] / static_cast<double>(step_ms.size());
  state.counters["compute1_ms"] = busy[1] / static_cast<double>(step_ms.size());
  state.counters["loss"] = loss;
}

void gpt_schedules(benchmark::internal::Benchmark* b) {
  b->ArgNames({"schedule", "split"});
  for (gpt_kind k : gpt_kinds) {
    b->Args({static_cast<long>(k), 1});
    if (k != gpt_kind::one_f_one_b && k != gpt_kind::interleaved)
      b->Args({static_cast<long>(k), 0});
  }
}

}  // namespace

BENCHMARK(bm_gpt)
    ->Apply(gpt_schedules)
    ->UseManualTime()
    ->Iterations(10)
    ->Unit(benchmark::kMillisecond);
BENCHMARK(bm_gpt_vocab)
    ->ArgNames({"vocab", "overlap", "tp"})
    ->Args({0, 1, 1})
    ->Args({1, 1, 1})
    ->Args({1, 0, 1})
    ->Args({2, 1, 1})
    ->Args({2, 0, 1})
    ->Args({0, 1, 2})
    ->Args({1, 1, 2})
    ->Args({2, 1, 2})
    ->UseManualTime()
    ->Iterations(4)
    ->Unit(benchmark::kMillisecond);
BENCHMARK(bm_search)->ArgName("limited")->Arg(1)->Arg(0)->Unit(benchmark::kMillisecond);
BENCHMARK(bm_step)->Apply(schedules)->UseManualTime()->Iterations(5)->Unit(benchmark::kMillisecond);
BENCHMARK(bm_overhead)
    ->Apply(schedules)
    ->UseManualTime()
    ->Iterations(50)
    ->Unit(benchmark::kMicrosecond);

BENCHMARK_MAIN();
