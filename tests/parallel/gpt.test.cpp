// Tests of weft/parallel/gpt.hpp on threads-backend ranks: a 2-layer GQA GPT over a device_mesh
// (dp, cp, tp) gives nn::gpt's single-device loss and gradients (f64 within 1e-12, f32 within
// 1e-5, relative to each parameter's largest gradient) on tp = 2 with and without sequence
// parallelism, cp = 2 and 4 (zigzag ring attention), dp = 2, and the 3-D 8-rank layout
// dp 2 x cp 2 x tp 2 with SP; every shard's initialisation is bitwise the single-device one's
// slice; the argument checks name what is wrong. Pipeline parallelism (gpt_pipeline_stage under
// the executor: 1F1B, GPipe, ZB-H1, ZB-H2; pp 2 alone, with tp 2 + SP, and the 4-D 16-rank layout
// pp 2 x dp 2 x cp 2 x tp 2 + SP; gpt_pipeline_chunks, two chunks a rank on a 4-layer model:
// interleaved 1F1B, ZBV and DualPipeV, alone and with tp 2 + SP, and V-Half with tp 2 + SP) gives
// the same numbers within
// the same tolerances; so do the vocabulary-balanced schedules (gpt_vocab_shard: the embedding
// and head sharded over pp) at pp 2 and 4, with cp 2, dp 2 and both, under the cross-entropy and
// a token loss.
#include <support/run_ranks.hpp>
#include <weft/comm/collectives.hpp>
#include <weft/comm/threads/communicator.hpp>
#include <weft/mesh/device_mesh.hpp>
#include <weft/nn/gpt.hpp>
#include <weft/parallel/gpt.hpp>
#include <weft/parallel/gpt_pipeline.hpp>
#include <weft/parallel/gpt_vocab.hpp>
#include <weft/pipeline/executor.hpp>
#include <weft/pipeline/lower.hpp>
#include <weft/pipeline/schedules/controllable_memory.hpp>
#include <weft/pipeline/schedules/dualpipe.hpp>
#include <weft/pipeline/schedules/gpipe.hpp>
#include <weft/pipeline/schedules/interleaved.hpp>
#include <weft/pipeline/schedules/one_f_one_b.hpp>
#include <weft/pipeline/schedules/vocab.hpp>
#include <weft/pipeline/schedules/zero_bubble.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <span>
#include <string>
#include <vector>

namespace {
using weft::index_t;
using weft::test::run_ranks;
using comm_t = weft::comm::threads::communicator;
namespace nn = weft::nn;
namespace par = weft::parallel;

nn::gpt_config small(index_t layers = 2) {
  nn::gpt_config c;
  c.vocab = 11;  // uneven over tp = 2: shards of 6 and 5 rows
  c.context = 16;
  c.d_model = 16;
  c.heads = 4;
  c.kv_heads = 2;
  c.layers = layers;
  c.mlp_hidden = 24;
  return c;
}

constexpr index_t kSeqs = 4, kSeq = 8;

struct data_t {
  std::vector<std::int32_t> tokens, targets;
  data_t() {
    for (index_t n = 0; n < kSeqs; ++n)
      for (index_t i = 0; i < kSeq; ++i) {
        auto const k = static_cast<std::uint32_t>(n * 131 + i * 17 + 5);
        tokens.push_back(static_cast<std::int32_t>(k % 11));
        // Next token as target, the last position ignored, plus one ignored in the middle.
        targets.push_back(
            i + 1 == kSeq || (n == 1 && i == 3) ? -1 : static_cast<std::int32_t>((k + 17) % 11));
      }
  }
  [[nodiscard]] index_t counted() const {
    return static_cast<index_t>(
        std::count_if(targets.begin(), targets.end(), [](std::int32_t t) { return t >= 0; }));
  }
};

// GPT-2's initialisation, scaled up and jittered by global index so that every path carries a
// gradient well above rounding (the same model in f32 and f64).
template <class T>
nn::param_store<T> reference_params(nn::gpt_config const& c) {
  nn::param_store<double> s(nn::gpt_layout(c));
  nn::gpt_init(s, c, 99);
  nn::param_store<T> out(nn::gpt_layout(c));
  for (std::size_t i = 0; i < s.params().size(); ++i)
    out.params()[i] =
        static_cast<T>(s.params()[i] * 4.0 + 0.05 * std::sin(0.37 * static_cast<double>(i)));
  return out;
}

template <class T>
struct reference_result {
  double loss = 0.0;
  nn::param_store<T> grads_as_params;  // the gradients, in a store so gpt_load_shard slices them
};

template <class T>
reference_result<T> single_device(nn::gpt_config const& c, data_t const& data) {
  auto store = reference_params<T>(c);
  std::vector<std::int32_t> positions;
  std::vector<std::int64_t> cu{0};
  for (index_t n = 0; n < kSeqs; ++n) {
    for (index_t i = 0; i < kSeq; ++i) positions.push_back(static_cast<std::int32_t>(i));
    cu.push_back((n + 1) * kSeq);
  }
  nn::gpt<T> model(c, store);
  double const loss = model.forward({data.tokens, positions, data.targets, cu});
  model.backward();
  reference_result<T> r{loss, nn::param_store<T>(nn::gpt_layout(c))};
  std::copy(store.grads().begin(), store.grads().end(), r.grads_as_params.params().begin());
  return r;
}

struct layout_case {
  int dp, cp, tp;
  bool sp;
  int pp = 1;
  char const* schedule = "1f1b";  // with pp > 1: 1f1b, gpipe, zb-h1, zb-h2, interleaved, zbv,
                                  // v-half, dualpipe-v (the last four: two chunks a rank)
  index_t layers = 2;
};

std::string describe(layout_case const& l) {
  return "dp " + std::to_string(l.dp) + " cp " + std::to_string(l.cp) + " tp " +
         std::to_string(l.tp) + (l.sp ? " +SP" : "") +
         (l.pp > 1 ? " pp " + std::to_string(l.pp) + " " + l.schedule : "") + " layers " +
         std::to_string(l.layers);
}

weft::pipeline::schedule schedule_of(std::string const& name, int p, int m) {
  if (name == "gpipe") return weft::pipeline::gpipe(p, m);
  if (name == "zb-h1") return weft::pipeline::zero_bubble_h1(p, m);
  if (name == "zb-h2") return weft::pipeline::zero_bubble_h2(p, m);
  if (name == "interleaved") return weft::pipeline::interleaved_one_f_one_b(p, m, 2);
  if (name == "zbv") return weft::pipeline::zero_bubble_v(p, m);
  if (name == "v-half") return weft::pipeline::v_half(p, m);
  if (name == "dualpipe-v") return weft::pipeline::dualpipe_v(p, m);
  return weft::pipeline::one_f_one_b(p, m);
}

// The largest |value| of a store's parameters (here: the single device's gradients).
template <class T>
double largest(nn::param_store<T>& store) {
  double m = 0.0;
  for (auto g : store.params()) m = std::max(m, std::abs(static_cast<double>(g)));
  return m;
}

// Appends to `bad` every parameter of `got` whose gradient differs from `want`'s values (the
// expected gradient's shard) by more than tol relative to the parameter's largest expected
// gradient; where that vanishes (the key bias: softmax is shift-invariant, so its true gradient
// is 0) relative to 1 % of the model's (`model_scale`).
template <class T>
void compare_grads(nn::param_store<T>& got_store, nn::param_store<T> const& want_store,
                   double model_scale, double tol, int rank, std::vector<std::string>& bad) {
  for (auto const& e : got_store.layout().entries()) {
    auto const got = got_store.grad_span(e.name);
    auto const want = want_store.param_span(e.name);
    double scale = 0.0, err = 0.0;
    for (std::size_t i = 0; i < got.size(); ++i) {
      scale = std::max(scale, std::abs(static_cast<double>(want[i])));
      err = std::max(err, std::abs(static_cast<double>(got[i]) - static_cast<double>(want[i])));
    }
    scale = std::max(scale, 0.01 * model_scale);
    if (!(err <= tol * scale))
      bad.push_back("rank " + std::to_string(rank) + " " + e.name + ": max error " +
                    std::to_string(err / scale) + " relative");
  }
}

// Runs one step on the layout and checks loss and gradients against the single device.
template <class T>
void check_layout(layout_case const& l, double tol) {
  auto const c = small(l.layers);
  data_t const data;
  auto ref = single_device<T>(c, data);
  auto whole = reference_params<T>(c);
  double const weight = 1.0 / static_cast<double>(data.counted());
  std::mutex m;
  std::vector<std::string> failures;
  run_ranks(l.pp * l.dp * l.cp * l.tp, [&](comm_t& world) {
    weft::device_mesh<comm_t> mesh(world, {l.pp, l.dp, l.cp, l.tp}, {"pp", "dp", "cp", "tp"},
                                   {{"dp", "cp"}});
    auto& tp = mesh.group("tp");
    auto& cp = mesh.group("cp");
    auto& pp = mesh.group("pp");
    auto& data_group = mesh.group({"dp", "cp"});
    par::gpt_parallelism const p{tp.size(), tp.rank(), l.sp,     cp.size(),
                                 cp.rank(), pp.size(), pp.rank()};
    // One store per chunk this rank holds (one unless the schedule puts several on a rank).
    int const per_dp = static_cast<int>(kSeqs / l.dp);
    auto const sched = schedule_of(l.schedule, l.pp, per_dp);
    auto const chunks =
        l.pp > 1 ? par::gpt_chunks(p, sched, pp.rank()) : std::vector<par::gpt_parallelism>{p};
    std::vector<nn::param_store<T>> stores;
    for (auto const& q : chunks) {
      stores.emplace_back(par::gpt_shard_layout(c, q));
      par::gpt_load_shard(stores.back(), whole, c, q);
    }
    auto& store = stores.front();
    // This dp rank's sequences.
    int const dpr = mesh.local_rank("dp");
    index_t const per = kSeqs / l.dp;
    auto const from = static_cast<std::size_t>(dpr * per * kSeq),
               count = static_cast<std::size_t>(per * kSeq);
    double loss = 0.0;
    if (l.pp == 1) {
      par::gpt<T, comm_t, comm_t> model(c, l.sp, tp, cp, store);
      par::gpt_sequences const b{std::span(data.tokens).subspan(from, count),
                                 std::span(data.targets).subspan(from, count), kSeq};
      loss = model.forward(b, weight);
      model.backward();
    } else {
      // One sequence per microbatch; the executor's token_mean weight 1 / (the batch's targets).
      auto const mb = [&](int i) {
        auto const at = from + static_cast<std::size_t>(i * kSeq);
        return par::gpt_sequences{std::span(data.tokens).subspan(at, kSeq),
                                  std::span(data.targets).subspan(at, kSeq), kSeq};
      };
      weft::pipeline::step_options opt;
      opt.total_tokens = static_cast<double>(data.counted());
      weft::pipeline::step_result r;
      if (chunks.size() == 1) {
        par::gpt_pipeline_stage<T, comm_t, comm_t> stage(c, p, tp, cp, store, mb);
        r = weft::pipeline::run_step(weft::pipeline::lower(sched), stage, pp, opt);
      } else {
        std::vector<nn::param_store<T>*> ptrs;
        for (auto& s : stores) ptrs.push_back(&s);
        par::gpt_pipeline_chunks<T, comm_t, comm_t> stage(c, chunks, tp, cp, ptrs, mb);
        r = weft::pipeline::run_step(weft::pipeline::lower(sched), stage, pp, opt);
      }
      // The loss lives on the last stage's ranks: sum it there over the data group, then share it.
      loss = r.has_loss ? r.loss : 0.0;
    }
    for (auto& s : stores) par::reduce_gpt_grads(tp, data_group, s);
    weft::comm::all_reduce(data_group, std::span<double>(&loss, 1), weft::comm::reduce_kind::sum)
        .wait();
    if (l.pp > 1)
      weft::comm::all_reduce(pp, std::span<double>(&loss, 1), weft::comm::reduce_kind::sum).wait();
    std::vector<std::string> bad;
    if (!(std::abs(loss - ref.loss) <= tol * std::abs(ref.loss)))
      bad.push_back("loss " + std::to_string(loss) + " vs " + std::to_string(ref.loss));
    // Errors relative to each parameter's largest gradient; where that vanishes (the key bias:
    // softmax is shift-invariant, so its true gradient is 0) relative to 1 % of the model's.
    double const model_scale = largest(ref.grads_as_params);
    for (std::size_t k = 0; k < chunks.size(); ++k) {
      // The expected shard of the gradient.
      nn::param_store<T> expect(par::gpt_shard_layout(c, chunks[k]));
      par::gpt_load_shard(expect, ref.grads_as_params, c, chunks[k]);
      compare_grads(stores[k], expect, model_scale, tol, world.rank(), bad);
    }
    std::lock_guard lock(m);
    failures.insert(failures.end(), bad.begin(), bad.end());
  });
  for (auto const& f : failures) MESSAGE(describe(l) << ": " << f);
  CHECK_MESSAGE(failures.empty(), describe(l));
}

// A smooth loss of the targets' log-probabilities with a coefficient of either sign per global
// row: sum_k c_k exp(logp_k) + d_k logp_k over the rows with a target (rows as gpt::rows()).
double smooth_rows_loss(index_t first_row, std::span<std::int64_t const> rows,
                        std::span<double const> logp, std::span<double> dlogp,
                        std::span<std::int32_t const> targets) {
  double loss = 0.0;
  for (std::size_t k = 0; k < rows.size(); ++k) {
    auto const g = first_row + rows[k];
    if (targets[static_cast<std::size_t>(g)] < 0) continue;
    double const c = std::sin(0.7 * static_cast<double>(g)),
                 d = 0.3 * std::cos(1.3 * static_cast<double>(g));
    loss += c * std::exp(logp[k]) + d * logp[k];
    dlogp[k] = c * std::exp(logp[k]) + d;
  }
  return loss;
}

// One step of a vocabulary-balanced schedule (layout l: pp ranks holding the blocks over their
// tp ranks, each also a gpt_vocab_shard of V / (pp tp) rows) against the single device: the loss,
// every stage's gradients and every vocabulary shard's rows of "wte" and "head". `smooth`:
// smooth_rows_loss instead of the cross-entropy, against the GPT's own token loss on one rank.
template <class T>
void check_vocab_layout(layout_case const& l, weft::pipeline::vocab_variant variant, double tol,
                        bool smooth = false) {
  auto const c = small(l.layers);
  data_t const data;
  auto whole = reference_params<T>(c);
  double const weight = 1.0 / static_cast<double>(data.counted());
  reference_result<T> ref{0.0, nn::param_store<T>(nn::gpt_layout(c))};
  if (smooth) {
    run_ranks(1, [&](comm_t& one) {
      auto store = reference_params<T>(c);
      par::gpt<T, comm_t, comm_t> model(c, false, one, one, store);
      model.set_token_loss([&](std::span<std::int64_t const> rows, std::span<double const> logp,
                               std::span<double> dlogp) {
        return smooth_rows_loss(0, rows, logp, dlogp, data.targets);
      });
      ref.loss = model.forward({data.tokens, data.targets, kSeq});
      model.backward();
      std::copy(store.grads().begin(), store.grads().end(), ref.grads_as_params.params().begin());
    });
  } else {
    ref = single_device<T>(c, data);
  }
  std::string const what = describe(l) + " " + std::string(weft::pipeline::to_string(variant)) +
                           (smooth ? " smooth token loss" : " cross-entropy");
  std::mutex m;
  std::vector<std::string> failures;
  run_ranks(l.pp * l.dp * l.cp * l.tp, [&](comm_t& world) {
    weft::device_mesh<comm_t> mesh(world, {l.pp, l.dp, l.cp, l.tp}, {"pp", "dp", "cp", "tp"},
                                   {{"dp", "cp"}, {"pp", "tp"}});
    auto& tp = mesh.group("tp");
    auto& cp = mesh.group("cp");
    auto& pp = mesh.group("pp");
    auto& data_group = mesh.group({"dp", "cp"});
    par::gpt_parallelism const p{tp.size(), tp.rank(), l.sp,      cp.size(),
                                 cp.rank(), pp.size(), pp.rank(), true};
    nn::param_store<T> store(par::gpt_shard_layout(c, p)), vstore(par::gpt_vocab_layout(c, p));
    par::gpt_load_shard(store, whole, c, p);
    par::gpt_vocab_load(vstore, whole, c, p);
    int const dpr = mesh.local_rank("dp");
    index_t const per = kSeqs / l.dp;
    auto const from = static_cast<std::size_t>(dpr * per * kSeq);
    auto const mb = [&](int i) {
      auto const at = from + static_cast<std::size_t>(i * kSeq);
      return par::gpt_sequences{std::span(data.tokens).subspan(at, kSeq),
                                std::span(data.targets).subspan(at, kSeq), kSeq};
    };
    par::gpt_pipeline_stage<T, comm_t, comm_t> stage(c, p, tp, cp, store, mb);
    par::gpt_vocab_shard<T, comm_t> shard(c, p, tp, vstore, mb);
    auto vc = pp.split(0, pp.rank());
    weft::pipeline::step_options opt;
    if (smooth) {
      opt.token_loss = shard.token_loss([&](int i, std::span<std::int64_t const> rows,
                                            std::span<double const> logp, std::span<double> dlogp) {
        return smooth_rows_loss(static_cast<index_t>(from) + i * kSeq, rows, logp, dlogp,
                                data.targets);
      });
    } else {
      opt.token_loss = shard.cross_entropy(weight);
    }
    auto const sched = weft::pipeline::lower(
        weft::pipeline::vocab_one_f_one_b(l.pp, static_cast<int>(per), variant));
    auto plan = weft::pipeline::prepare_step(sched, pp.rank(), stage, shard);
    auto const r = weft::pipeline::run_step(plan, stage, shard, pp, vc, opt);
    double loss = r.has_loss ? r.loss : 0.0;
    par::reduce_gpt_grads(tp, data_group, store);
    par::reduce_gpt_grads(tp, data_group, vstore);
    weft::comm::all_reduce(data_group, std::span<double>(&loss, 1), weft::comm::reduce_kind::sum)
        .wait();
    weft::comm::all_reduce(pp, std::span<double>(&loss, 1), weft::comm::reduce_kind::sum).wait();
    std::vector<std::string> bad;
    if (!(std::abs(loss - ref.loss) <= tol * std::abs(ref.loss)))
      bad.push_back("loss " + std::to_string(loss) + " vs " + std::to_string(ref.loss));
    double const model_scale = largest(ref.grads_as_params);
    nn::param_store<T> expect(par::gpt_shard_layout(c, p)), vexpect(par::gpt_vocab_layout(c, p));
    par::gpt_load_shard(expect, ref.grads_as_params, c, p);
    par::gpt_vocab_load(vexpect, ref.grads_as_params, c, p);
    compare_grads(store, expect, model_scale, tol, world.rank(), bad);
    compare_grads(vstore, vexpect, model_scale, tol, world.rank(), bad);
    // The replica gathered over pp x tp from the stages and the vocabulary shards is the single
    // device's parameters bit for bit (each element has one writer).
    nn::param_store<T> replica(nn::gpt_layout(c));
    par::gpt_gather_replica(mesh.group({"pp", "tp"}), store, replica, c, p, &vstore);
    if (std::memcmp(replica.params().data(), whole.params().data(), whole.params().size_bytes()) !=
        0)
      bad.push_back("rank " + std::to_string(world.rank()) + ": the gathered replica differs");
    // Every stage and shard has a gradient to compare (a wiring slip would leave zeros).
    if (vstore.grads().empty() ||
        std::all_of(vstore.grads().begin(), vstore.grads().end(), [](T g) { return g == T(0); }))
      bad.push_back("rank " + std::to_string(world.rank()) + ": no vocabulary gradient");
    std::lock_guard lock(m);
    failures.insert(failures.end(), bad.begin(), bad.end());
  });
  for (auto const& f : failures) MESSAGE(what << ": " << f);
  CHECK_MESSAGE(failures.empty(), what);
}

layout_case const kLayouts[] = {
    {1, 1, 1, false}, {1, 1, 2, false}, {1, 1, 2, true}, {1, 2, 1, false},
    {1, 4, 1, false}, {2, 1, 1, false}, {1, 2, 2, true}, {2, 2, 2, true},
};

layout_case const kPipelineLayouts[] = {
    {1, 1, 1, false, 2, "1f1b"}, {1, 1, 1, false, 2, "gpipe"}, {1, 1, 1, false, 2, "zb-h1"},
    {1, 1, 2, true, 2, "1f1b"},  {2, 2, 2, true, 2, "1f1b"},   {1, 1, 1, false, 2, "zb-h2"},
};

// Two chunks a rank: 4 virtual stages of one block each over pp = 2 (m = 4 microbatches, what
// DualPipeV's m >= 2p needs).
layout_case const kChunkLayouts[] = {
    {1, 1, 1, false, 2, "interleaved", 4}, {1, 1, 1, false, 2, "zbv", 4},
    {1, 1, 1, false, 2, "dualpipe-v", 4},  {1, 1, 2, true, 2, "dualpipe-v", 4},
    {1, 1, 2, true, 2, "interleaved", 4},  {1, 1, 2, true, 2, "v-half", 4},
};

}  // namespace

// Thread ranks: the `threads` label, which CI also runs under ThreadSanitizer.
TEST_SUITE("threads") {
  TEST_CASE("parallel gpt: f64 loss and gradients equal the single device's within 1e-12") {
    for (auto const& l : kLayouts) check_layout<double>(l, 1e-12);
  }

  TEST_CASE("parallel gpt: f32 loss and gradients equal the single device's within 1e-5") {
    for (auto const& l : kLayouts) check_layout<float>(l, 1e-5);
  }

  TEST_CASE("parallel gpt: pipeline stages under the executor equal the single device") {
    for (auto const& l : kPipelineLayouts) check_layout<double>(l, 1e-12);
    for (auto const& l : kPipelineLayouts) check_layout<float>(l, 1e-5);
  }

  TEST_CASE("parallel gpt: two chunks a rank (gpt_pipeline_chunks) equal the single device") {
    for (auto const& l : kChunkLayouts) check_layout<double>(l, 1e-12);
    // Twice the blocks of the other layouts, so twice the f32 rounding on the way to the first
    // block's weights: h1.q.w reached 1.2e-5 of its largest gradient under clang's TSan build
    // (1e-5 elsewhere); f64 above is the check of the arithmetic.
    for (auto const& l : kChunkLayouts) check_layout<float>(l, 2e-5);
  }

  TEST_CASE("parallel gpt: the split backward (I then W) is the fused one bit for bit") {
    // One stage holding everything (embeddings, both blocks, head), on tp 1 and on tp 2 with
    // SP (the all-gathered gradients and the embedding's collective in I): backward_input_stage
    // writes the fused backward's input gradient and accumulates no gradient at all, and
    // backward_weight_stage then adds exactly the fused backward's, bit for bit.
    auto const c = small();
    data_t const data;
    auto whole = reference_params<double>(c);
    for (int tp_size : {1, 2}) {
      CAPTURE(tp_size);
      std::mutex m;
      int checked = 0;
      run_ranks(tp_size, [&](comm_t& tp) {
        auto solo = tp.split(tp.rank(), 0);
        par::gpt_parallelism const p{tp.size(), tp.rank(), tp_size > 1, 1, 0};
        nn::param_store<double> fused(par::gpt_shard_layout(c, p));
        nn::param_store<double> split(par::gpt_shard_layout(c, p));
        par::gpt_load_shard(fused, whole, c, p);
        par::gpt_load_shard(split, whole, c, p);
        par::gpt<double, comm_t, comm_t> a(c, p, tp, solo, fused), b(c, p, tp, solo, split);
        par::gpt_sequences const batch{data.tokens, data.targets, kSeq};
        double const la = a.forward_stage(batch, 0.01, {}, {});
        double const lb = b.forward_stage(batch, 0.01, {}, {});
        a.backward_stage({}, {});
        b.backward_input_stage({}, {});
        bool nothing_yet = true;
        for (double g : split.grads()) nothing_yet = nothing_yet && g == 0.0;
        // Pending weight gradients: no forward, no other backward until W.
        CHECK_THROWS_WITH_AS(b.forward_stage(batch, 0.01, {}, {}),
                             doctest::Contains("backward_weight_stage first"),
                             weft::invalid_argument_error);
        CHECK_THROWS_AS(b.backward_input_stage({}, {}), weft::invalid_argument_error);
        b.backward_weight_stage();
        CHECK_THROWS_WITH_AS(b.backward_weight_stage(),
                             doctest::Contains("a backward_input_stage before it"),
                             weft::invalid_argument_error);
        bool same = la == lb && nothing_yet;
        for (std::size_t i = 0; i < fused.grads().size(); ++i)
          same = same && std::memcmp(&fused.grads()[i], &split.grads()[i], sizeof(double)) == 0;
        bool nonzero = false;
        for (double g : fused.grads()) nonzero = nonzero || g != 0.0;
        std::lock_guard lock(m);
        CHECK(same);
        CHECK(nonzero);
        ++checked;
      });
      CHECK(checked == tp_size);
    }
  }

  TEST_CASE("parallel gpt: gpt_pipeline_chunks refuses chunks and stores that do not match") {
    auto const c = small(4);
    run_ranks(1, [&](comm_t& world) {
      auto const sched = weft::pipeline::zero_bubble_v(2, 4);
      auto const chunks = par::gpt_chunks(par::gpt_parallelism{}, sched, 1);
      REQUIRE(chunks.size() == 2);
      CHECK(chunks[0].pp == 4);
      CHECK(chunks[0].pp_rank == 1);  // rank 1 holds stages 1 and 2 of the V
      CHECK(chunks[1].pp_rank == 2);
      nn::param_store<double> s0(par::gpt_shard_layout(c, chunks[0]));
      nn::param_store<double> s1(par::gpt_shard_layout(c, chunks[1]));
      auto const mb = [](int) { return par::gpt_sequences{}; };
      using chunks_t = par::gpt_pipeline_chunks<double, comm_t, comm_t>;
      CHECK_THROWS_WITH_AS(chunks_t(c, chunks, world, world, {&s0}, mb),
                           doctest::Contains("argument `stores`: expected 2 (one per chunk)"),
                           weft::invalid_argument_error);
      CHECK_THROWS_WITH_AS(chunks_t(c, {chunks[0], chunks[0]}, world, world, {&s0, &s0}, mb),
                           doctest::Contains("distinct stages"), weft::invalid_argument_error);
      auto other = chunks;
      other[1].sequence_parallel = true;
      CHECK_THROWS_WITH_AS(chunks_t(c, other, world, world, {&s0, &s1}, mb),
                           doctest::Contains("chunk 1 differs from chunk 0"),
                           weft::invalid_argument_error);
      CHECK_THROWS_WITH_AS(chunks_t(c, chunks, world, world, {&s0, nullptr}, mb),
                           doctest::Contains("null at chunk 1"), weft::invalid_argument_error);
      // Stores in the wrong order: chunk 0's model refuses chunk 1's layout, which has the same
      // size (one block each) but other names.
      CHECK(s0.layout().size() == s1.layout().size());
      CHECK_THROWS_WITH_AS(chunks_t(c, chunks, world, world, {&s1, &s0}, mb),
                           doctest::Contains("argument `store parameter 0`: expected h1."),
                           weft::shape_error);
      chunks_t ok(c, chunks, world, world, {&s0, &s1}, mb);
      CHECK(ok.num_chunks() == 2);
      CHECK_THROWS_WITH_AS(ok.reserve_slots(2, 1), doctest::Contains("argument `chunk`"),
                           weft::invalid_argument_error);
      weft::pipeline::stage_call call;
      call.chunk = 1;
      call.stage = 1;  // chunk 1 is stage 2
      call.num_stages = 4;
      CHECK_THROWS_WITH_AS((void)ok.input_layout(call), doctest::Contains("stage_call::stage"),
                           weft::invalid_argument_error);
    });
  }

  TEST_CASE("parallel gpt: bad layouts and batches are refused with the value named") {
    auto c = small();
    CHECK_THROWS_AS(par::gpt_shard_layout(c, {4, 0, false, 1, 0}), weft::invalid_argument_error);
    CHECK_THROWS_WITH(par::gpt_shard_layout(c, {4, 0, false, 1, 0}), doctest::Contains("kv_heads"));
    CHECK_THROWS_AS(par::gpt_shard_layout(c, {2, 2, false, 1, 0}), weft::invalid_argument_error);
    auto few = small();
    few.vocab = 1;  // fewer vocabulary rows than tp ranks
    few.kv_heads = 2;
    CHECK_THROWS_WITH(par::gpt_shard_layout(few, {2, 0, false, 1, 0}),
                      doctest::Contains("gpt_config::vocab"));
    data_t const data;
    run_ranks(2, [&](comm_t& world) {
      auto solo = world.split(world.rank(), 0);
      par::gpt_parallelism const p{1, 0, false, 2, world.rank()};
      nn::param_store<double> store(par::gpt_shard_layout(c, p));
      par::gpt<double, comm_t, comm_t> model(c, false, solo, world, store);
      // seq_len 6 is not a multiple of 2 * cp = 4: refused before anything is communicated.
      std::vector<std::int32_t> t(12, 1);
      CHECK_THROWS_WITH(model.forward({t, t, 6}), doctest::Contains("2 * cp"));
      std::vector<std::int32_t> bad = data.tokens;
      bad[5] = 11;
      CHECK_THROWS_WITH(model.forward({bad, data.targets, kSeq}), doctest::Contains("tokens[5]"));
    });
    // A store of another layout.
    run_ranks(1, [&](comm_t& world) {
      nn::param_store<double> wrong(nn::gpt_layout([] {
        auto k = small();
        k.layers = 1;
        return k;
      }()));
      CHECK_THROWS_AS((par::gpt<double, comm_t, comm_t>(c, false, world, world, wrong)),
                      weft::shape_error);
    });
  }

  TEST_CASE("parallel gpt: gpt_gather_replica joins one chunk or two a rank bit for bit") {
    // The single-device model, and every layout's shards initialised on their own ranks: the
    // gathered replica is the single device's bit for bit, on every rank of the model group.
    auto const c = small(4);
    nn::param_store<float> whole(nn::gpt_layout(c));
    nn::gpt_init(whole, c, 31);
    struct gather_case {
      int pp, tp;
      bool sp;
      char const* schedule;  // "": pp 1
    };
    gather_case const cases[] = {{1, 1, false, ""},     {1, 2, true, ""},
                                 {2, 1, false, "1f1b"}, {4, 2, false, "1f1b"},
                                 {2, 2, true, "zbv"},   {2, 1, false, "interleaved"},
                                 {2, 2, false, "v-min"}};
    for (auto const& g : cases) {
      INFO("pp " << g.pp << " tp " << g.tp << " " << g.schedule);
      std::mutex m;
      int bad = 0, checked = 0;
      run_ranks(g.pp * g.tp, [&](comm_t& world) {
        weft::device_mesh<comm_t> mesh(world, {g.pp, g.tp}, {"pp", "tp"});
        auto& tp = mesh.group("tp");
        auto& pp = mesh.group("pp");
        par::gpt_parallelism const p{tp.size(), tp.rank(), g.sp, 1, 0, pp.size(), pp.rank()};
        auto const chunks = g.pp > 1
                                ? par::gpt_chunks(p, schedule_of(g.schedule, g.pp, 4), pp.rank())
                                : std::vector<par::gpt_parallelism>{p};
        std::vector<nn::param_store<float>> stores;
        stores.reserve(chunks.size());
        std::vector<nn::param_store<float> const*> ptrs;
        for (auto const& q : chunks) {
          stores.emplace_back(par::gpt_shard_layout(c, q));
          par::gpt_init_shard(stores.back(), c, q, 31);
          ptrs.push_back(&stores.back());
        }
        nn::param_store<float> replica(nn::gpt_layout(c));
        if (chunks.size() == 1) {
          par::gpt_gather_replica(world, stores.front(), replica, c, p);
        } else if (pp.rank() % 2 == 0) {
          par::gpt_gather_replica(world, ptrs, replica, c, chunks);
        } else {  // the stores as gpt_pipeline_chunks takes them
          std::vector<nn::param_store<float>*> mutable_ptrs;
          for (auto& st : stores) mutable_ptrs.push_back(&st);
          par::gpt_gather_replica(world, mutable_ptrs, replica, c, chunks);
        }
        bool const same = std::memcmp(replica.params().data(), whole.params().data(),
                                      whole.params().size_bytes()) == 0;
        std::lock_guard lock(m);
        bad += same ? 0 : 1;
        ++checked;
      });
      CHECK(checked == g.pp * g.tp);
      CHECK(bad == 0);
    }
    // Under vocab_pipeline the vocabulary shards' rows join the stages' pieces.
    for (int pp : {2, 4}) {
      INFO("vocab_pipeline pp " << pp);
      std::mutex m;
      int bad = 0;
      run_ranks(pp, [&](comm_t& world) {
        par::gpt_parallelism const p{1, 0, false, 1, 0, pp, world.rank(), true};
        nn::param_store<float> stage(par::gpt_shard_layout(c, p)),
            vocab(par::gpt_vocab_layout(c, p)), replica(nn::gpt_layout(c));
        par::gpt_init_shard(stage, c, p, 31);
        par::gpt_vocab_init(vocab, c, p, 31);
        par::gpt_gather_replica(world, stage, replica, c, p, &vocab);
        bool const same = std::memcmp(replica.params().data(), whole.params().data(),
                                      whole.params().size_bytes()) == 0;
        std::string refused;
        try {  // the vocabulary shard is required (checked before any communication)
          par::gpt_gather_replica(world, stage, replica, c, p);
        } catch (weft::invalid_argument_error const& e) {
          refused = e.what();
        }
        std::lock_guard lock(m);
        bad += same && refused.find("argument `vocab`") != std::string::npos ? 0 : 1;
      });
      CHECK(bad == 0);
    }
    // What it refuses, before any communication (one rank, so nothing would wait).
    run_ranks(1, [&](comm_t& world) {
      par::gpt_parallelism const p{1, 0, false, 1, 0, 2, 0};
      auto const chunks = par::gpt_chunks(p, schedule_of("zbv", 2, 4), 0);  // stages 0 and 3
      std::vector<nn::param_store<float>> stores;
      stores.reserve(2);
      for (auto const& q : chunks) stores.emplace_back(par::gpt_shard_layout(c, q));
      std::vector<nn::param_store<float> const*> ptrs{&stores[0], &stores[1]};
      nn::param_store<float> replica(nn::gpt_layout(c));
      auto const message = [&](auto const& shards, auto const& qs) -> std::string {
        try {
          par::gpt_gather_replica(world, shards, replica, c, qs);
        } catch (weft::error const& e) {
          return e.what();
        }
        return "no error";
      };
      // A group of 1 where pp 4 / 2 chunks x tp 1 = 2 ranks hold the replica.
      CHECK(message(ptrs, chunks).find("model_group.size()") != std::string::npos);
      CHECK(message(ptrs, chunks).find("pp / chunks * tp = 2") != std::string::npos);
      auto twice = chunks;
      twice[1].pp_rank = twice[0].pp_rank;
      CHECK(message(ptrs, twice).find("distinct stages") != std::string::npos);
      auto other = chunks;
      other[1].tp = 2;
      CHECK(message(ptrs, other).find("differs from chunk 0") != std::string::npos);
      std::vector<nn::param_store<float> const*> one{&stores[0]};
      CHECK(message(one, chunks).find("one per chunk") != std::string::npos);
      std::vector<nn::param_store<float> const*> null{&stores[0], nullptr};
      CHECK(message(null, chunks).find("null at chunk 1") != std::string::npos);
      std::vector<nn::param_store<float> const*> swapped{&stores[1], &stores[0]};
      CHECK(message(swapped, chunks).find("elements in chunk 0") != std::string::npos);
      CHECK(message(ptrs, std::vector<par::gpt_parallelism>{}).find("at least one chunk") !=
            std::string::npos);
      // The one-store form names its own arguments.
      auto const one_store = [&](nn::param_store<float> const& shard,
                                 par::gpt_parallelism const& q) -> std::string {
        try {
          par::gpt_gather_replica(world, shard, replica, c, q);
        } catch (weft::error const& e) {
          return e.what();
        }
        return "no error";
      };
      CHECK(one_store(stores[0], chunks[1]).find("argument `shard`") != std::string::npos);
      nn::param_store<float> const stage0(par::gpt_shard_layout(c, p));  // pp 2, stage 0
      CHECK(one_store(stage0, p).find("pp * tp = 2") != std::string::npos);
    });
  }

  TEST_CASE(
      "parallel gpt: the vocabulary-balanced schedules (gpt_vocab_shard) equal the single device") {
    // The embedding and head sharded over the pipeline ranks, the loss from the executor's C0
    // (the GPT's cross-entropy as a token loss: the data have ignored targets), against nn::gpt.
    // f64 within 1e-12: only C0's association of the softmax sums differs.
    using weft::pipeline::vocab_variant;
    for (auto v : {vocab_variant::one_barrier, vocab_variant::two_barrier}) {
      check_vocab_layout<double>({1, 1, 1, false, 2}, v, 1e-12);
      check_vocab_layout<double>({1, 1, 1, false, 4, "1f1b", 4}, v, 1e-12);
      check_vocab_layout<double>({1, 2, 1, false, 2}, v, 1e-12);
      check_vocab_layout<double>({2, 1, 1, false, 2}, v, 1e-12);
      check_vocab_layout<float>({1, 1, 1, false, 2}, v, 1e-5);
    }
    check_vocab_layout<double>({2, 2, 1, false, 2, "1f1b", 4}, vocab_variant::one_barrier, 1e-12);
  }

  TEST_CASE("parallel gpt: the vocabulary-balanced schedules over tensor parallelism") {
    // Each pipeline rank's vocabulary rows split again over its tp ranks (V / (pp tp) a shard),
    // the shard combining its passes over tp; with sequence parallelism the first stage keeps
    // its token slice of the embeddings and the last all-gathers the final norm's slices.
    using weft::pipeline::vocab_variant;
    for (auto v : {vocab_variant::one_barrier, vocab_variant::two_barrier}) {
      check_vocab_layout<double>({1, 1, 2, false, 2}, v, 1e-12);
      check_vocab_layout<double>({1, 1, 2, true, 2}, v, 1e-12);
      check_vocab_layout<float>({1, 1, 2, true, 2}, v, 1e-5);
    }
    check_vocab_layout<double>({1, 1, 2, true, 4, "1f1b", 4}, vocab_variant::two_barrier, 1e-12);
    check_vocab_layout<double>({2, 1, 2, true, 2}, vocab_variant::one_barrier, 1e-12);
    check_vocab_layout<double>({1, 2, 2, true, 2}, vocab_variant::two_barrier, 1e-12);
    check_vocab_layout<double>({1, 1, 2, true, 2}, vocab_variant::one_barrier, 1e-12, true);
    check_vocab_layout<double>({1, 2, 2, false, 2}, vocab_variant::two_barrier, 1e-12, true);
  }

  TEST_CASE("parallel gpt: a token loss under the vocabulary-balanced schedules") {
    // A loss of the targets' log-probabilities with per-row coefficients of both signs, given as
    // a microbatch_loss_fn (rows, logp, dlogp): equal to the GPT's own token loss on one rank.
    using weft::pipeline::vocab_variant;
    for (auto v : {vocab_variant::one_barrier, vocab_variant::two_barrier}) {
      check_vocab_layout<double>({1, 1, 1, false, 2}, v, 1e-12, true);
      check_vocab_layout<double>({1, 2, 1, false, 2}, v, 1e-12, true);
    }
  }

  TEST_CASE("parallel gpt: what the vocabulary-balanced layout refuses") {
    auto const c = small(2);
    par::gpt_parallelism const plain{1, 0, false, 1, 0, 2, 0};
    CHECK_THROWS_WITH_AS(par::gpt_vocab_layout(c, plain),
                         doctest::Contains("gpt_parallelism::vocab_pipeline"),
                         weft::invalid_argument_error);
    auto tiny = c;
    tiny.vocab = 1;
    CHECK_THROWS_WITH_AS(par::gpt_vocab_layout(tiny, {1, 0, false, 1, 0, 2, 0, true}),
                         doctest::Contains(">= pp * tp = 2"), weft::invalid_argument_error);
    tiny.vocab = 3;
    CHECK_THROWS_WITH_AS(par::gpt_vocab_layout(tiny, {2, 1, false, 1, 0, 2, 0, true}),
                         doctest::Contains(">= pp * tp = 4"), weft::invalid_argument_error);
    // A shard of tp 2 needs the tp group, of that size and rank.
    {
      par::gpt_parallelism const tp2{2, 1, false, 1, 0, 2, 0, true};
      nn::param_store<double> vs(par::gpt_vocab_layout(c, tp2));
      auto const none = [](int) { return par::gpt_sequences{}; };
      CHECK_THROWS_WITH_AS(par::gpt_vocab_shard<double>(c, tp2, vs, none),
                           doctest::Contains("1 without a tp group"), weft::invalid_argument_error);
      run_ranks(1, [&](comm_t& one) {
        CHECK_THROWS_WITH_AS((par::gpt_vocab_shard<double, comm_t>(c, tp2, one, vs, none)),
                             doctest::Contains("1, 0 (the tp group's)"),
                             weft::invalid_argument_error);
      });
    }
    // The built-in cross-entropy counts every token: a microbatch with ignored targets fails
    // the step on every rank, naming the row; a token loss on the stage is refused.
    data_t const data;
    std::mutex m;
    std::vector<std::string> errors;
    run_ranks(2, [&](comm_t& pp) {
      par::gpt_parallelism const p{1, 0, false, 1, 0, 2, pp.rank(), true};
      auto whole = reference_params<double>(c);
      nn::param_store<double> store(par::gpt_shard_layout(c, p)),
          vstore(par::gpt_vocab_layout(c, p));
      par::gpt_load_shard(store, whole, c, p);
      par::gpt_vocab_load(vstore, whole, c, p);
      auto const mb = [&](int i) {
        auto const at = static_cast<std::size_t>(i * kSeq);
        return par::gpt_sequences{std::span(data.tokens).subspan(at, kSeq),
                                  std::span(data.targets).subspan(at, kSeq), kSeq};
      };
      comm_t self = pp.split(pp.rank(), 0);
      auto const loss = [](int, std::span<std::int64_t const>, std::span<double const>,
                           std::span<double>) { return 0.0; };
      std::string refused;
      try {
        par::gpt_pipeline_stage<double, comm_t, comm_t> bad(c, p, self, self, store, mb, loss);
      } catch (weft::invalid_argument_error const& e) {
        refused = e.what();
      }
      par::gpt_pipeline_stage<double, comm_t, comm_t> stage(c, p, self, self, store, mb);
      par::gpt_vocab_shard<double> shard(c, p, vstore, mb);
      auto vc = pp.split(0, pp.rank());
      auto const sched = weft::pipeline::lower(
          weft::pipeline::vocab_one_f_one_b(2, 2, weft::pipeline::vocab_variant::two_barrier));
      auto plan = weft::pipeline::prepare_step(sched, pp.rank(), stage, shard);
      std::string failed = "no error";
      try {
        (void)weft::pipeline::run_step(plan, stage, shard, pp, vc);
      } catch (weft::error const& e) {
        failed = e.what();
      }
      std::lock_guard lock(m);
      errors.push_back(refused);
      errors.push_back(failed);
    });
    REQUIRE(errors.size() == 4);
    for (std::size_t k = 0; k < 4; k += 2) {
      CHECK(errors[k].find("argument `token_loss`") != std::string::npos);
      CHECK(errors[k].find("step_options::token_loss") != std::string::npos);
      CHECK(errors[k + 1].find("has no target (-1)") != std::string::npos);
    }
  }

}  // TEST_SUITE("threads")

TEST_CASE("parallel gpt: every shard's initialisation is bitwise the single-device slice") {
  auto const c = small();
  nn::param_store<float> whole(nn::gpt_layout(c));
  nn::gpt_init(whole, c, 2024);
  for (int tp : {1, 2}) {
    for (int r = 0; r < tp; ++r) {
      for (bool sp : {false, true}) {
        par::gpt_parallelism const p{tp, r, sp, 1, 0, 1, 0};
        nn::param_store<float> a(par::gpt_shard_layout(c, p)), b(par::gpt_shard_layout(c, p));
        par::gpt_init_shard(a, c, p, 2024);
        par::gpt_load_shard(b, whole, c, p);
        INFO("tp " << tp << " rank " << r);
        REQUIRE(a.params().size() == b.params().size());
        CHECK(std::memcmp(a.params().data(), b.params().data(), a.params().size_bytes()) == 0);
        // The shards are what they claim: sharded parameters smaller, flags set.
        auto const& wte = a.layout().at("wte");
        CHECK(wte.shape[0] == (tp == 1 ? 11 : (r == 0 ? 6 : 5)));
        CHECK(wte.info.tp_sharded);
        CHECK(a.layout().at("h0.o.w").shape[1] == 16 / tp);
        CHECK_FALSE(a.layout().at("h0.o.b").info.tp_sharded);
        CHECK(a.layout().at("h1.ln2.w").info.sequence_parallel_grad == sp);
        CHECK(a.layout().at("wpe").info.sequence_parallel_grad == sp);
        CHECK_FALSE(a.layout().at("h0.proj.b").info.sequence_parallel_grad);
      }
    }
  }
  // Pipeline stages: each holds its blocks (and the first the embeddings, the last the head),
  // bitwise the single device's; together they hold every parameter once.
  auto three = c;
  three.layers = 3;
  nn::param_store<float> whole3(nn::gpt_layout(three));
  nn::gpt_init(whole3, three, 7);
  for (int pp : {2, 3}) {
    std::size_t held = 0;
    for (int s = 0; s < pp; ++s) {
      par::gpt_parallelism const p{2, 1, true, 1, 0, pp, s};
      nn::param_store<float> a(par::gpt_shard_layout(three, p)), b(par::gpt_shard_layout(three, p));
      par::gpt_init_shard(a, three, p, 7);
      par::gpt_load_shard(b, whole3, three, p);
      INFO("pp " << pp << " stage " << s);
      CHECK(std::memcmp(a.params().data(), b.params().data(), a.params().size_bytes()) == 0);
      CHECK(a.layout().contains("wte") == (s == 0));
      CHECK(a.layout().contains("wpe") == (s == 0));
      CHECK(a.layout().contains("head") == (s == pp - 1));
      CHECK(a.layout().contains("lnf.w") == (s == pp - 1));
      auto const range = par::gpt_stage_layers(3, pp, s);
      for (index_t l = 0; l < 3; ++l)
        CHECK(a.layout().contains("h" + std::to_string(l) + ".q.w") == range.contains(l));
      for (auto const& e : a.layout().entries()) held += e.info.count;
    }
    par::gpt_parallelism const whole_tp{2, 1, true, 1, 0};
    CHECK(held == par::gpt_shard_layout(three, whole_tp).size());
  }
  // Under vocab_pipeline no stage holds "wte" or "head": each (pipeline, tp) rank's vocabulary
  // shard holds its rows of both, bitwise the single device's, and the rows cover the vocabulary
  // once, pipeline rank by pipeline rank, each split over its tp ranks.
  for (auto const& [pp_, tp_] :
       {std::pair{2, 1}, std::pair{3, 1}, std::pair{2, 2}, std::pair{3, 2}}) {
    int const pp = pp_, tp = tp_;  // (clang's lambdas cannot capture structured bindings)
    index_t rows = 0;
    for (int q = 0; q < pp * tp; ++q) {
      int const s = q / tp;
      par::gpt_parallelism const p{tp, q % tp, false, 1, 0, pp, s, true};
      INFO("vocab_pipeline pp " << pp << " tp " << tp << " rank " << s << ", " << q % tp);
      auto const stage = par::gpt_shard_layout(three, p);
      CHECK_FALSE(stage.contains("wte"));
      CHECK_FALSE(stage.contains("head"));
      CHECK(stage.contains("wpe") == (s == 0));
      CHECK(stage.contains("lnf.w") == (s == pp - 1));
      nn::param_store<float> a(par::gpt_vocab_layout(three, p)), b(par::gpt_vocab_layout(three, p));
      par::gpt_vocab_init(a, three, p, 7);
      par::gpt_vocab_load(b, whole3, three, p);
      CHECK(std::memcmp(a.params().data(), b.params().data(), a.params().size_bytes()) == 0);
      auto const want = par::gpt_vocab_rows(three, p);
      CHECK(a.layout().at("wte").shape == std::vector<index_t>{want.size, 16});
      CHECK(a.layout().at("head").shape == std::vector<index_t>{want.size, 16});
      CHECK(want.begin == rows);
      rows += want.size;
    }
    CHECK(rows == three.vocab);
  }
  // The split: layers / pp each, the first layers % pp stages one more.
  CHECK(par::gpt_stage_layers(3, 2, 0).first == 0);
  CHECK(par::gpt_stage_layers(3, 2, 0).last == 2);
  CHECK(par::gpt_stage_layers(3, 2, 1).first == 2);
  CHECK(par::gpt_stage_layers(3, 2, 1).last == 3);
  CHECK(par::gpt_stage_layers(7, 3, 2).first == 5);
  CHECK(par::gpt_stage_layers(7, 3, 2).size() == 2);
  CHECK_THROWS_WITH(par::gpt_shard_layout(three, {1, 0, false, 1, 0, 4, 0}),
                    doctest::Contains("gpt_parallelism::pp"));
}
