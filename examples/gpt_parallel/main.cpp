// gpt_parallel — trains a GPT language model with weft's parallel layers on any pp × dp × cp × tp
// layout of thread ranks: the blocks split into pipeline stages run by weft's executor (1F1B,
// GPipe or ZB-H1 over microbatches), vocabulary-parallel embedding and output layer, column/row-
// parallel attention and MLP (optionally sequence-parallel), zigzag ring attention over cp,
// gradients reduced over dp × cp, the global gradient norm clipped over pp × tp, AdamW with
// warmup + cosine.
// The data is a fixed random Markov chain over the vocabulary (each token is followed by its
// successor under a fixed permutation 90 % of the time), so the loss falls from log V towards the
// chain's entropy. With --check it also trains the single-device nn::gpt from the same
// initialisation on the same batches and compares the losses step by step.
//
//   gpt_parallel [--dp N] [--tp N] [--cp N] [--pp N] [--microbatches M] [--schedule NAME] [--sp]
//                [--steps N] [--batch B] [--seq-len S]
//                [--layers L] [--d-model D] [--heads H] [--kv-heads K] [--vocab V] [--lr X]
//                [--seed N] [--f64] [--check]
//
// Exit status: 0 when the loss fell (and, with --check, followed the single device), 1 when a
// check fails, 2 on a bad command line or a layout the model cannot be split over.
#include "common/cli.hpp"

#include <weft/comm/collectives.hpp>
#include <weft/comm/threads/world.hpp>
#include <weft/core/error.hpp>
#include <weft/mesh/device_mesh.hpp>
#include <weft/nn/gpt.hpp>
#include <weft/optim/adamw.hpp>
#include <weft/optim/clip.hpp>
#include <weft/optim/lr_schedule.hpp>
#include <weft/parallel/gpt.hpp>
#include <weft/parallel/gpt_pipeline.hpp>
#include <weft/pipeline/executor.hpp>
#include <weft/pipeline/lower.hpp>
#include <weft/pipeline/schedules/controllable_memory.hpp>
#include <weft/pipeline/schedules/dualpipe.hpp>
#include <weft/pipeline/schedules/gpipe.hpp>
#include <weft/pipeline/schedules/interleaved.hpp>
#include <weft/pipeline/schedules/one_f_one_b.hpp>
#include <weft/pipeline/schedules/zero_bubble.hpp>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <iostream>
#include <mutex>
#include <numeric>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace {

namespace nn = weft::nn;
namespace par = weft::parallel;
namespace optim = weft::optim;
using weft::index_t;
using comm_t = weft::comm::threads::communicator;

struct options {
  int dp = 1, tp = 1, cp = 1, pp = 1;
  int microbatches = 0;  // 0: one sequence per microbatch under pp > 1, else the whole batch
  std::string schedule = "1f1b";
  bool sp = false;
  int steps = 20;
  int batch = 8;  // global sequences per step
  int seq_len = 32;
  int layers = 2, d_model = 64, heads = 4, kv_heads = 0, vocab = 64;
  double lr = 3e-3;
  std::uint64_t seed = 0;
  bool f64 = false;
  bool check = false;
};

void usage(std::ostream& os) {
  os << "usage: gpt_parallel [--dp N] [--tp N] [--cp N] [--pp N] [--microbatches M]\n"
        "                    [--schedule NAME] [--sp] [--steps N] [--batch B]\n"
        "                    [--seq-len S] [--layers L] [--d-model D] [--heads H] [--kv-heads K]\n"
        "                    [--vocab V] [--lr X] [--seed N] [--f64] [--check] [--help]\n\n"
        "Trains a GPT on pp x dp x cp x tp thread ranks and prints the loss per step.\n"
        "  --dp, --tp, --cp  data-, tensor- and context-parallel degrees (default 1 each; at most\n"
        "                    64 ranks in all). tp divides heads, kv-heads and 4 d-model; cp needs\n"
        "                    seq-len a multiple of 2 cp; dp divides batch\n"
        "  --pp              pipeline stages (default 1; at most --layers): the blocks split\n"
        "                    evenly, run by weft's pipeline executor\n"
        "  --microbatches    microbatches per dp rank and step under --pp (default: one sequence\n"
        "                    each); divides batch / dp; 1f1b and zb-h1 need at least pp\n"
        "  --schedule        1f1b (default), gpipe, zb-h1, zb-h2 (the backward split into I and\n"
        "                    W, W deferred), or with two chunks a\n"
        "                    rank (2 x pp virtual stages, at most --layers): interleaved\n"
        "                    (Megatron's interleaved 1F1B; microbatches a multiple of pp), zbv,\n"
        "                    v-half, v-min (ZBV's V at about 1/2 and 1/3 of its activations),\n"
        "                    dualpipe-v (at least 2 x pp microbatches)\n"
        "  --sp              sequence parallelism between the tensor-parallel layers\n"
        "  --steps           training steps (default 20)\n"
        "  --batch           sequences per step over all dp ranks (default 8)\n"
        "  --seq-len         tokens per sequence (default 32; the model's context)\n"
        "  --layers, --d-model, --heads, --kv-heads (0: heads), --vocab  the model (default 2,\n"
        "                    64, 4, 0, 64)\n"
        "  --lr              peak AdamW learning rate (default 3e-3; warmup 10 %, cosine to 10 %)\n"
        "  --seed            initialisation and data seed (default 0)\n"
        "  --f64             train in double precision (default float)\n"
        "  --check           also train the single-device model and compare the losses\n";
}

using weft::examples::bad_argument;
using weft::examples::parse_number;

bool is_schedule(std::string_view s) {
  return s == "1f1b" || s == "gpipe" || s == "zb-h1" || s == "zb-h2" || s == "interleaved" ||
         s == "zbv" || s == "v-half" || s == "v-min" || s == "dualpipe-v";
}

// Model chunks a rank holds under the schedule.
int chunks_of(std::string_view s) {
  return s == "interleaved" || s == "zbv" || s == "v-half" || s == "v-min" || s == "dualpipe-v" ? 2
                                                                                                : 1;
}

// The compute-only schedule; weft::schedule_error (naming the rule) where it refuses (pp, m).
weft::pipeline::schedule make_schedule(std::string_view s, int pp, int m) {
  namespace pl = weft::pipeline;
  if (s == "gpipe") return pl::gpipe(pp, m);
  if (s == "zb-h1") return pl::zero_bubble_h1(pp, m);
  if (s == "zb-h2") return pl::zero_bubble_h2(pp, m);
  if (s == "interleaved") return pl::interleaved_one_f_one_b(pp, m, 2);
  if (s == "zbv") return pl::zero_bubble_v(pp, m);
  if (s == "v-half") return pl::v_half(pp, m);
  if (s == "v-min") return pl::v_min(pp, m);
  if (s == "dualpipe-v") return pl::dualpipe_v(pp, m);
  return pl::one_f_one_b(pp, m);
}

options parse(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    std::string_view const a = argv[i];
    auto value = [&] { return weft::examples::flag_value(argc, argv, i); };
    if (a == "--help") {
      usage(std::cout);
      std::exit(0);
    } else if (a == "--dp") {
      o.dp = parse_number(a, value(), 1, 64);
    } else if (a == "--tp") {
      o.tp = parse_number(a, value(), 1, 64);
    } else if (a == "--cp") {
      o.cp = parse_number(a, value(), 1, 64);
    } else if (a == "--pp") {
      o.pp = parse_number(a, value(), 1, 64);
    } else if (a == "--microbatches") {
      o.microbatches = parse_number(a, value(), 1, 4096);
    } else if (a == "--schedule") {
      o.schedule = std::string(value());
      if (!is_schedule(o.schedule))
        throw bad_argument{
            "argument `--schedule`: expected 1f1b, gpipe, zb-h1, zb-h2, interleaved, zbv, v-half, "
            "v-min or dualpipe-v, actual `" +
            o.schedule + "`"};
    } else if (a == "--sp") {
      o.sp = true;
    } else if (a == "--steps") {
      o.steps = parse_number(a, value(), 2, 100000);
    } else if (a == "--batch") {
      o.batch = parse_number(a, value(), 1, 4096);
    } else if (a == "--seq-len") {
      o.seq_len = parse_number(a, value(), 2, 8192);
    } else if (a == "--layers") {
      o.layers = parse_number(a, value(), 1, 64);
    } else if (a == "--d-model") {
      o.d_model = parse_number(a, value(), 1, 8192);
    } else if (a == "--heads") {
      o.heads = parse_number(a, value(), 1, 256);
    } else if (a == "--kv-heads") {
      o.kv_heads = parse_number(a, value(), 0, 256);
    } else if (a == "--vocab") {
      o.vocab = parse_number(a, value(), 2, 1 << 20);
    } else if (a == "--lr") {
      o.lr = parse_number(a, value(), 0.0, 1.0);
    } else if (a == "--seed") {
      o.seed = parse_number<std::uint64_t>(a, value(), 0, ~std::uint64_t{0});
    } else if (a == "--f64") {
      o.f64 = true;
    } else if (a == "--check") {
      o.check = true;
    } else {
      throw bad_argument{"unknown argument `" + std::string(a) + "` (see --help)"};
    }
  }
  if (o.pp * o.dp * o.tp * o.cp > 64)
    throw bad_argument{"argument `--pp x --dp x --tp x --cp`: expected at most 64 ranks, actual " +
                       std::to_string(o.pp * o.dp * o.tp * o.cp)};
  if (o.batch % o.dp != 0)
    throw bad_argument{"argument `--batch`: expected a multiple of --dp = " + std::to_string(o.dp) +
                       ", actual " + std::to_string(o.batch)};
  if (o.pp > o.layers)
    throw bad_argument{"argument `--pp`: expected at most --layers = " + std::to_string(o.layers) +
                       " (every stage holds a block), actual " + std::to_string(o.pp)};
  if (o.pp > 1 && chunks_of(o.schedule) * o.pp > o.layers)
    throw bad_argument{
        "argument `--layers`: expected at least " + std::to_string(chunks_of(o.schedule) * o.pp) +
        " (" + o.schedule + " holds " + std::to_string(chunks_of(o.schedule)) +
        " chunks a rank, each at least a block), actual " + std::to_string(o.layers)};
  int const per = o.batch / o.dp;
  if (o.microbatches == 0) o.microbatches = o.pp > 1 ? per : 1;
  if (per % o.microbatches != 0)
    throw bad_argument{"argument `--microbatches`: expected a divisor of batch / dp = " +
                       std::to_string(per) + ", actual " + std::to_string(o.microbatches)};
  if (o.microbatches > 1 && o.pp == 1)
    throw bad_argument{
        "argument `--microbatches`: expected 1 without --pp (gradient accumulation "
        "runs through the pipeline executor), actual " +
        std::to_string(o.microbatches)};
  if (o.pp > 1 && o.schedule != "gpipe" && o.microbatches < o.pp)
    throw bad_argument{
        "argument `--microbatches`: expected at least --pp = " + std::to_string(o.pp) + " for " +
        o.schedule + ", actual " + std::to_string(o.microbatches)};
  if (o.pp > 1) {
    try {
      (void)make_schedule(o.schedule, o.pp, o.microbatches);
    } catch (weft::schedule_error const& e) {
      throw bad_argument{"arguments `--pp " + std::to_string(o.pp) + " --microbatches " +
                         std::to_string(o.microbatches) + "`: " + o.schedule +
                         " refuses them: " + e.message()};
    }
  }
  return o;
}

// ---- the data -----------------------------------------------------------------------------------

std::uint64_t mix(std::uint64_t x) {  // splitmix64's finaliser
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// The global batch of `step`: tokens and next-token targets (the last position has none).
struct batch_data {
  std::vector<std::int32_t> tokens, targets;
};

batch_data make_batch(options const& o, int step) {
  std::vector<std::int32_t> succ(static_cast<std::size_t>(o.vocab));
  std::iota(succ.begin(), succ.end(), 0);
  for (std::size_t i = succ.size() - 1; i > 0; --i)
    std::swap(succ[i], succ[mix(o.seed ^ (0xabcdull + i)) % (i + 1)]);
  batch_data b;
  auto const v = static_cast<std::uint64_t>(o.vocab);
  for (int n = 0; n < o.batch; ++n) {
    std::uint64_t h = mix(o.seed * 1000003ull + static_cast<std::uint64_t>(step) * 7919ull +
                          static_cast<std::uint64_t>(n));
    std::vector<std::int32_t> seq(static_cast<std::size_t>(o.seq_len + 1));
    seq[0] = static_cast<std::int32_t>(h % v);
    for (std::size_t i = 1; i < seq.size(); ++i) {
      h = mix(h);
      seq[i] = h % 10 == 0 ? static_cast<std::int32_t>(mix(h) % v)
                           : succ[static_cast<std::size_t>(seq[i - 1])];
    }
    for (int i = 0; i < o.seq_len; ++i) {
      b.tokens.push_back(seq[static_cast<std::size_t>(i)]);
      b.targets.push_back(seq[static_cast<std::size_t>(i + 1)]);
    }
  }
  return b;
}

nn::gpt_config config_of(options const& o) {
  nn::gpt_config c;
  c.vocab = o.vocab;
  c.context = o.seq_len;
  c.d_model = o.d_model;
  c.heads = o.heads;
  c.kv_heads = o.kv_heads;
  c.layers = o.layers;
  return c;
}

optim::adamw_options adam_of(options const& o) {
  optim::adamw_options a;
  a.lr = o.lr;
  a.weight_decay = 0.1;
  return a;
}

double lr_at(options const& o, int step) {
  // Megatron counts the step about to be taken from 1.
  auto const s = optim::lr_schedule::cosine(o.lr, 0.1 * o.lr, std::max(1, o.steps / 10), o.steps);
  return s(step + 1);
}

// ---- the runs -----------------------------------------------------------------------------------

// The single-device reference: nn::gpt, the same init, data, clipping and optimizer.
template <class T>
std::vector<double> train_single(options const& o) {
  auto const c = config_of(o);
  nn::param_store<T> store(nn::gpt_layout(c));
  nn::gpt_init(store, c, o.seed);
  nn::gpt<T> model(c, store);
  auto const infos = store.layout().infos();
  optim::adamw<T> opt(infos, adam_of(o));
  std::vector<std::int32_t> positions;
  std::vector<std::int64_t> cu{0};
  for (int n = 0; n < o.batch; ++n) {
    for (int i = 0; i < o.seq_len; ++i) positions.push_back(i);
    cu.push_back(static_cast<std::int64_t>(n + 1) * o.seq_len);
  }
  auto solo = weft::comm::threads::world(1);
  std::vector<double> losses;
  solo.run([&](comm_t& one) {
    for (int step = 0; step < o.steps; ++step) {
      auto const b = make_batch(o, step);
      store.zero_grad();
      losses.push_back(model.forward({b.tokens, positions, b.targets, cu}));
      model.backward();
      optim::clip_grad_norm(one, infos, store.grads(), 0, 1.0);
      opt.step(store.params(), store.grads(), lr_at(o, step));
    }
  });
  return losses;
}

template <class T>
std::vector<double> train_parallel(options const& o) {
  auto const c = config_of(o);
  std::vector<double> losses;
  std::mutex print;
  namespace pl = weft::pipeline;
  weft::comm::threads::world(o.pp * o.dp * o.cp * o.tp).run([&](comm_t& world) {
    // pp outermost, tp innermost (Megatron's order); the data group dp × cp reduces gradients,
    // the model group pp × tp holds disjoint pieces of them (the gradient norm's group).
    weft::device_mesh<comm_t> mesh(world, {o.pp, o.dp, o.cp, o.tp}, {"pp", "dp", "cp", "tp"},
                                   {{"dp", "cp"}, {"pp", "tp"}});
    auto& tp = mesh.group("tp");
    auto& cp = mesh.group("cp");
    auto& pp = mesh.group("pp");
    auto& data = mesh.group({"dp", "cp"});
    auto& model_group = mesh.group({"pp", "tp"});
    par::gpt_parallelism const p{tp.size(), tp.rank(), o.sp,     cp.size(),
                                 cp.rank(), pp.size(), pp.rank()};
    // One parameter store (and optimizer) per model chunk this rank holds: one, or two for the
    // schedules with two chunks a rank (each a virtual stage of 2 x pp).
    std::optional<pl::schedule> sched;
    if (o.pp > 1) sched = make_schedule(o.schedule, o.pp, o.microbatches);
    auto const chunks =
        sched ? par::gpt_chunks(p, *sched, pp.rank()) : std::vector<par::gpt_parallelism>{p};
    std::vector<nn::param_store<T>> stores;
    std::vector<std::vector<optim::param_info>> infos;
    std::vector<optim::adamw<T>> opts;
    stores.reserve(chunks.size());  // the stages below hold pointers to the stores
    infos.reserve(chunks.size());
    opts.reserve(chunks.size());
    for (auto const& q : chunks) {
      stores.emplace_back(par::gpt_shard_layout(c, q));
      par::gpt_init_shard(stores.back(), c, q, o.seed);
      infos.push_back(stores.back().layout().infos());
      opts.emplace_back(infos.back(), adam_of(o));
    }
    std::vector<optim::grad_group<T>> groups;
    for (std::size_t k = 0; k < stores.size(); ++k) groups.push_back({infos[k], stores[k].grads()});
    int const dpr = mesh.local_rank("dp");
    auto const per = static_cast<std::size_t>(o.batch / o.dp * o.seq_len);
    auto const mb_len = per / static_cast<std::size_t>(o.microbatches);
    // Step 0's batch already: prepare_step below reads the microbatches' shapes (their spans
    // must lie inside the batch; an empty one made them subspans past its end).
    batch_data b = make_batch(o, 0);
    // Microbatch i of this dp rank's share of the step's batch (every stage reads the same).
    auto const microbatch = [&](int i) {
      auto const at = static_cast<std::size_t>(dpr) * per + static_cast<std::size_t>(i) * mb_len;
      return par::gpt_sequences{std::span<std::int32_t const>(b.tokens).subspan(at, mb_len),
                                std::span<std::int32_t const>(b.targets).subspan(at, mb_len),
                                o.seq_len};
    };
    std::optional<par::gpt<T, comm_t, comm_t>> model;
    std::optional<par::gpt_pipeline_stage<T, comm_t, comm_t>> stage;
    std::optional<par::gpt_pipeline_chunks<T, comm_t, comm_t>> chunked;
    std::optional<pl::step_plan> plan;
    if (o.pp == 1) {
      model.emplace(c, p, tp, cp, stores.front());
    } else if (chunks.size() == 1) {
      stage.emplace(c, p, tp, cp, stores.front(), microbatch);
      plan = pl::prepare_step(pl::lower(*sched, pl::replay_model::executor()), pp.rank(), *stage);
    } else {
      std::vector<nn::param_store<T>*> ptrs;
      for (auto& s : stores) ptrs.push_back(&s);
      chunked.emplace(c, chunks, tp, cp, ptrs, microbatch);
      plan = pl::prepare_step(pl::lower(*sched, pl::replay_model::executor()), pp.rank(), *chunked);
    }
    for (int step = 0; step < o.steps; ++step) {
      auto const t0 = std::chrono::steady_clock::now();
      b = make_batch(o, step);
      auto const counted =
          std::count_if(b.targets.begin(), b.targets.end(), [](std::int32_t t) { return t >= 0; });
      for (auto& s : stores) s.zero_grad();
      double loss = 0.0;
      if (model) {
        loss = model->forward(microbatch(0), 1.0 / static_cast<double>(counted));
        model->backward();
      } else {
        pl::step_options so;
        so.total_tokens = static_cast<double>(counted);  // the mean over the global batch
        auto const r =
            stage ? pl::run_step(*plan, *stage, pp, so) : pl::run_step(*plan, *chunked, pp, so);
        loss = r.has_loss ? r.loss : 0.0;
      }
      for (auto& s : stores) par::reduce_gpt_grads(tp, data, s);
      // One norm over every chunk of every pp x tp rank, one all-reduce.
      double const norm = optim::clip_grad_norm(model_group, groups, tp.rank(), 1.0);
      for (std::size_t k = 0; k < stores.size(); ++k)
        opts[k].step(stores[k].params(), stores[k].grads(), lr_at(o, step));
      // The loss: each tp rank of the last stage holds its rows' part; count one per tp group.
      if (tp.rank() != 0) loss = 0.0;
      weft::comm::all_reduce(world, std::span<double>(&loss, 1), weft::comm::reduce_kind::sum)
          .wait();
      auto const dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (world.rank() == 0) {
        losses.push_back(loss);
        std::lock_guard lock(print);
        std::printf("step %4d  loss %.6f  grad norm %.4f  lr %.2e  %.0f tokens/s\n", step + 1, loss,
                    norm, lr_at(o, step),
                    static_cast<double>(o.batch) * o.seq_len / std::max(dt, 1e-9));
        std::fflush(stdout);
      }
    }
  });
  return losses;
}

template <class T>
int run(options const& o) {
  std::printf(
      "gpt_parallel: pp %d x dp %d x cp %d x tp %d%s on %d thread ranks, %s; %d layers, d %d, "
      "%d heads (%d kv), vocab %d; %d x %d tokens per step\n",
      o.pp, o.dp, o.cp, o.tp, o.sp ? " (+SP)" : "", o.pp * o.dp * o.cp * o.tp,
      o.f64 ? "f64" : "f32", o.layers, o.d_model, o.heads, o.kv_heads > 0 ? o.kv_heads : o.heads,
      o.vocab, o.batch, o.seq_len);
  auto const losses = train_parallel<T>(o);
  int status = 0;
  std::printf("loss %.6f -> %.6f (log V = %.4f)\n", losses.front(), losses.back(),
              std::log(static_cast<double>(o.vocab)));
  if (!(losses.back() < losses.front())) {
    std::printf("FAILED: the loss did not fall\n");
    status = 1;
  }
  if (o.check) {
    auto const ref = train_single<T>(o);
    double const tol = o.f64 ? 1e-9 : 1e-3;
    double worst = 0.0;
    for (std::size_t s = 0; s < ref.size(); ++s)
      worst = std::max(worst, std::abs(losses[s] - ref[s]) / std::abs(ref[s]));
    std::printf(
        "check: single-device loss %.6f -> %.6f; largest relative difference %.3g over "
        "%zu steps (tolerance %.0e)\n",
        ref.front(), ref.back(), worst, ref.size(), tol);
    if (!(worst <= tol)) {
      std::printf("FAILED: the parallel run left the single device's losses\n");
      status = 1;
    }
  }
  return status;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    auto const o = parse(argc, argv);
    return o.f64 ? run<double>(o) : run<float>(o);
  } catch (bad_argument const& e) {
    std::cerr << "gpt_parallel: " << e.message << "\n";
    usage(std::cerr);
    return 2;
  } catch (weft::invalid_argument_error const& e) {  // shape_error too
    std::cerr << "gpt_parallel: " << e.what() << "\n";
    return 2;
  }
}
