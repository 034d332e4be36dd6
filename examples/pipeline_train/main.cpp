// pipeline_train — trains a small language model split into pipeline stages on thread ranks under
// every schedule weft generates, with weft's pipeline executor: a token embedding, 2p residual
// MLP blocks and an output layer with cross-entropy (model.hpp), cut into stages (stage.hpp),
// learning a fixed random next-token table. Prints the loss per step and the measured makespan,
// optionally writes each schedule's last measured timeline beside its simulation as SVG, and
// checks that every schedule trained the same model: the plain schedules compute the same
// gradients bit for bit, the vocabulary-parallel ones within fp32 rounding, so their losses agree.
//
//   pipeline_train [--schedule NAME[,NAME...]|all] [--ranks P] [--microbatches M] [--steps N]
//                  [--svg-dir DIR]
//
// Exit status: 0 when the losses agree and fell, 1 when a check fails, 2 on a bad command line.
#include "model.hpp"
#include "stage.hpp"

#include <weft/comm/threads/world.hpp>
#include <weft/core/error.hpp>
#include <weft/pipeline/executor.hpp>
#include <weft/pipeline/lower.hpp>
#include <weft/pipeline/measured.hpp>
#include <weft/pipeline/schedules/controllable_memory.hpp>
#include <weft/pipeline/schedules/dualpipe.hpp>
#include <weft/pipeline/schedules/gpipe.hpp>
#include <weft/pipeline/schedules/interleaved.hpp>
#include <weft/pipeline/schedules/one_f_one_b.hpp>
#include <weft/pipeline/schedules/vocab.hpp>
#include <weft/pipeline/schedules/zero_bubble.hpp>
#include <weft/pipeline/simulate.hpp>
#include <weft/pipeline/validate.hpp>

#include <algorithm>
#include <bit>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

namespace {

namespace pl = weft::pipeline;
using pipeline_train::model_config;
using pipeline_train::sz;

// ---- the schedules ------------------------------------------------------------------------------

struct schedule_kind {
  std::string_view name;
  std::string_view what;
};

constexpr schedule_kind kinds[] = {
    {"gpipe", "GPipe: all forwards, then all backwards"},
    {"1f1b", "1F1B: one forward, one backward in the steady state"},
    {"interleaved", "interleaved 1F1B, 2 chunks per rank (Megatron's group table)"},
    {"zb-h1", "ZB-H1: backward split into I and W, W filling the bubbles"},
    {"zb-h2", "ZB-H2: I and W split, 2P-1 in flight, no bubble inside a rank's window"},
    {"zbv", "ZBV: zero bubble with 2 chunks per rank in a V"},
    {"v-half", "V-Half: ZBV's V and split backward at about half of 1F1B's activations"},
    {"v-min", "V-Min: ZBV's V and split backward at about a third of 1F1B's activations"},
    {"dualpipe-v", "DualPipeV: 2 chunks per rank in a V, F paired with B (DeepSeek's order)"},
    {"vocab-1", "vocabulary-balanced 1F1B, 1 barrier (the VP paper's Vocab-2)"},
    {"vocab-2", "vocabulary-balanced 1F1B, 2 barriers (the VP paper's Vocab-1)"},
};

// The compute-only schedule of `name`: weft's generators apply Megatron's and PyTorch's rules
// (m >= p for 1F1B, ZB-H1, ZB-H2 and the vocabulary schedules; interleaved needs m a multiple of
// p, DualPipeV m >= 2p) and throw weft::schedule_error naming the parameter otherwise.
pl::schedule make_schedule(std::string_view name, int p, int m) {
  if (name == "gpipe") return pl::gpipe(p, m);
  if (name == "1f1b") return pl::one_f_one_b(p, m);
  if (name == "interleaved") return pl::interleaved_one_f_one_b(p, m, 2);
  if (name == "zb-h1") return pl::zero_bubble_h1(p, m);
  if (name == "zb-h2") return pl::zero_bubble_h2(p, m);
  if (name == "zbv") return pl::zero_bubble_v(p, m);
  if (name == "v-half") return pl::v_half(p, m);
  if (name == "v-min") return pl::v_min(p, m);
  if (name == "dualpipe-v") return pl::dualpipe_v(p, m);
  if (name == "vocab-1") return pl::vocab_one_f_one_b(p, m, pl::vocab_variant::one_barrier);
  return pl::vocab_one_f_one_b(p, m, pl::vocab_variant::two_barrier);
}

// ---- the command line ---------------------------------------------------------------------------

struct options {
  std::vector<std::string> schedules;  // empty: all
  bool all = true;                     // --schedule all (or none given): skip what (P, M) rules out
  int ranks = 4;
  int microbatches = 8;
  int steps = 5;
  std::string svg_dir;  // empty: no SVG
};

void usage(std::ostream& os) {
  os << "usage: pipeline_train [--schedule NAME[,NAME...]|all] [--ranks P] [--microbatches M]\n"
        "                      [--steps N] [--svg-dir DIR] [--help]\n\n"
        "Trains a small language model (embedding, 2P residual MLP blocks, output layer) split\n"
        "over P thread ranks for N steps of M microbatches under each schedule, prints the loss\n"
        "per step and checks that every schedule trained the same model.\n\n"
        "  --schedule      schedules to run, comma-separated, or `all` (default all: every\n"
        "                  schedule that takes P and M; a named one that does not is an error):\n";
  for (auto const& k : kinds) os << "                    " << k.name << ": " << k.what << "\n";
  os << "                  (the vocab-* schedules shard the embedding and the output layer over\n"
        "                  all ranks; weft names them by barrier count, the paper the other way)\n";
  os << "  --ranks         pipeline ranks P, in [2, 16] (default 4)\n"
        "  --microbatches  microbatches M per step, in [1, 1024] (default 8); 1F1B, ZB-H1, ZB-H2\n"
        "                  and the vocabulary schedules need M >= P, interleaved M a multiple of\n"
        "                  P, DualPipeV M >= 2P\n"
        "  --steps         training steps N, in [2, 10000] (default 5)\n"
        "  --svg-dir       write DIR/pipeline_train_<schedule>.svg: the last step's measured\n"
        "                  timeline below its simulation with the measured op times\n";
}

// A bad command line: says which argument, what was expected and what was given.
struct bad_argument {
  std::string message;
};

int parse_int(std::string_view flag, std::string_view text, int lo, int hi) {
  int value = 0;
  auto const [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc{} || end != text.data() + text.size() || value < lo || value > hi)
    throw bad_argument{"argument `" + std::string(flag) + "`: expected an integer in [" +
                       std::to_string(lo) + ", " + std::to_string(hi) + "], actual `" +
                       std::string(text) + "`"};
  return value;
}

std::vector<std::string> parse_schedules(std::string_view text) {
  std::vector<std::string> out;
  if (text == "all") return out;
  while (true) {
    auto const comma = text.find(',');
    auto const name = text.substr(0, comma);
    bool const known = std::any_of(std::begin(kinds), std::end(kinds),
                                   [&](schedule_kind const& k) { return k.name == name; });
    if (!known) {
      std::string expected;
      for (auto const& k : kinds) expected += std::string(k.name) + ", ";
      throw bad_argument{"argument `--schedule`: expected `all` or names from " + expected +
                         "comma-separated, actual `" + std::string(name) + "`"};
    }
    if (std::find(out.begin(), out.end(), name) == out.end()) out.emplace_back(name);
    if (comma == std::string_view::npos) return out;
    text.remove_prefix(comma + 1);
  }
}

// Returns false for --help.
bool parse(int argc, char** argv, options& o) {
  for (int i = 1; i < argc; ++i) {
    std::string_view const flag = argv[i];
    if (flag == "--help" || flag == "-h") return false;
    bool const known = flag == "--schedule" || flag == "--ranks" || flag == "--microbatches" ||
                       flag == "--steps" || flag == "--svg-dir";
    if (!known)
      throw bad_argument{"argument `" + std::string(flag) +
                         "`: expected one of --schedule, --ranks, --microbatches, --steps, "
                         "--svg-dir, --help, actual an unknown argument"};
    if (i + 1 >= argc)
      throw bad_argument{"argument `" + std::string(flag) + "`: expected a value, actual none"};
    std::string_view const value = argv[++i];
    if (flag == "--schedule") {
      o.schedules = parse_schedules(value);
      o.all = o.schedules.empty();
    } else if (flag == "--ranks")
      o.ranks = parse_int(flag, value, 2, 16);
    else if (flag == "--microbatches")
      o.microbatches = parse_int(flag, value, 1, 1024);
    else if (flag == "--steps")
      o.steps = parse_int(flag, value, 2, 10000);
    else if (value.empty())
      throw bad_argument{"argument `--svg-dir`: expected a directory, actual an empty string"};
    else
      o.svg_dir = value;
  }
  if (o.schedules.empty())
    for (auto const& k : kinds) o.schedules.emplace_back(k.name);
  return true;
}

// ---- training -----------------------------------------------------------------------------------

struct run_result {
  std::string name;
  pl::schedule lowered;
  std::vector<double> losses;                // per step, from the last stage's rank
  std::vector<pl::measured_timeline> steps;  // per step, all ranks on one time axis
};

double ms(std::chrono::nanoseconds d) {
  return std::chrono::duration<double, std::milli>(d).count();
}

// Trains a fresh model for `steps` steps under `lowered` on p thread ranks. Each rank builds its
// stage (and shard) from the same counter-based initialisation, prepares the step plan once, and
// per step: zeroes its gradients, runs the step, and applies Adam to its own parameters. No rank
// ever needs another's gradients: pipeline parallelism partitions the parameters.
run_result train(std::string const& name, pl::schedule lowered, model_config const& cfg,
                 options const& o) {
  int const p = lowered.num_ranks(), m = lowered.num_microbatches();
  bool const vocab_parallel = lowered.vocab() != pl::vocab_variant::none;
  run_result out{name, std::move(lowered), std::vector<double>(sz(o.steps), 0.0), {}};
  auto const& program = out.lowered;
  // Every microbatch has n tokens, and the loss is the token mean over the step: the executor
  // weights each microbatch's summed loss by 1 / (m n) before backward.
  pl::step_options step_opt;
  step_opt.tokens.assign(sz(m), sz(cfg.tokens));
  pipeline_train::adam const optimizer;
  std::vector<std::vector<pl::step_result>> results(sz(o.steps),
                                                    std::vector<pl::step_result>(sz(p)));

  weft::comm::threads::options world_opt;
  world_opt.timeout = std::chrono::seconds(60);  // a failing rank makes the others throw by then
  weft::comm::threads::run(
      p,
      [&](weft::comm::threads::communicator& comm) {
        int const rank = comm.rank();
        pipeline_train::model_stage stage(cfg, program, rank, vocab_parallel);
        // Runs every step with `run_one` (one executor step) over `params` (this rank's share).
        auto loop = [&](auto&& run_one, std::vector<pipeline_train::parameter*> const& params,
                        auto&& set_batch) {
          for (int k = 0; k < o.steps; ++k) {
            auto const data = pipeline_train::make_batch(cfg, k, m);  // each rank loads its copy
            set_batch(&data);
            for (auto* prm : params) prm->zero_grad();
            pl::step_result r = run_one();
            for (auto* prm : params) optimizer.step(*prm, k + 1);
            if (r.has_loss) out.losses[sz(k)] = r.loss;
            results[sz(k)][sz(rank)] = std::move(r);
          }
        };
        if (!vocab_parallel) {
          auto plan = pl::prepare_step(program, rank, stage);
          loop([&] { return pl::run_step(plan, stage, comm, step_opt); }, stage.parameters(),
               [&](pipeline_train::batch const* b) { stage.set_batch(b); });
          return;
        }
        // The vocabulary passes' collectives get a channel of their own, split up front, so that
        // they never interleave with the pipeline's point-to-point messages.
        auto vocab_channel = comm.split(0, rank);
        pipeline_train::vocab_shard shard(cfg, rank, p);
        auto plan = pl::prepare_step(program, rank, stage, shard);
        auto params = stage.parameters();
        for (auto* prm : shard.parameters()) params.push_back(prm);
        loop([&] { return pl::run_step(plan, stage, shard, comm, vocab_channel, step_opt); },
             params,
             [&](pipeline_train::batch const* b) {
               stage.set_batch(b);
               shard.set_batch(b);
             });
      },
      world_opt);
  for (auto const& per_rank : results) out.steps.push_back(pl::merge_timelines(per_rank));
  return out;
}

// Writes the last step's measured timeline under its simulation with the op times it measured
// (fit_costs): the difference is what the run added to the schedule's own bubbles (waiting for
// messages, the executor's bookkeeping, and on a busy machine waiting for a core).
void write_svg(run_result const& r, std::string const& dir) {
  auto const& timeline = r.steps.back();
  auto const costs = pl::fit_costs(r.lowered, timeline);
  auto const path = std::filesystem::path(dir) / ("pipeline_train_" + r.name + ".svg");
  std::ofstream svg(path);
  svg << pl::render_measured_svg(r.lowered, timeline, costs, {r.name + ", last step, ms"});
  if (!svg) throw std::runtime_error("cannot write " + path.string());
  std::cout << "  wrote " << path.string() << "\n";
}

}  // namespace

int main(int argc, char** argv) {
  options o;
  try {
    if (!parse(argc, argv, o)) {
      usage(std::cout);
      return 0;
    }
  } catch (bad_argument const& e) {
    std::cerr << "pipeline_train: " << e.message << "\n(--help lists the arguments)\n";
    return 2;
  }

  model_config cfg;
  cfg.blocks = 2 * o.ranks;  // at least one block on every stage of the 2-chunk schedules
  // Round V up to a multiple of p: the vocabulary shards hold V/p rows each (as Megatron pads
  // the vocabulary for vocabulary parallelism).
  cfg.vocab = (cfg.vocab + o.ranks - 1) / o.ranks * o.ranks;

  // Build and check every schedule before training anything, so a bad combination of --ranks and
  // --microbatches is reported up front.
  std::vector<std::pair<std::string, pl::schedule>> programs;
  for (auto const& name : o.schedules) {
    try {
      auto lowered =
          pl::lower(make_schedule(name, o.ranks, o.microbatches), pl::replay_model::executor());
      // Proves the SEND/RECV order deadlock-free for the executor before anything runs.
      pl::validate(lowered, pl::replay_model::executor());
      programs.emplace_back(name, std::move(lowered));
    } catch (weft::schedule_error const& e) {
      if (o.all) {
        std::printf("skipping %s: it does not take --ranks %d --microbatches %d (%s)\n",
                    name.c_str(), o.ranks, o.microbatches, e.message().c_str());
        continue;
      }
      std::cerr << "pipeline_train: --schedule " << name << " does not take --ranks " << o.ranks
                << " --microbatches " << o.microbatches << ": " << e.message() << "\n";
      return 2;
    }
  }
  if (!o.svg_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(o.svg_dir, ec);
    if (ec) {
      std::cerr << "pipeline_train: argument `--svg-dir`: expected a directory that can be "
                   "created, actual `"
                << o.svg_dir << "` (" << ec.message() << ")\n";
      return 2;
    }
  }

  std::printf(
      "model: vocabulary %d, hidden %d, ffn %d, %d residual MLP blocks; %d tokens per "
      "microbatch\npipeline: %d thread ranks, %d microbatches per step, %d steps, Adam lr %g\n",
      cfg.vocab, cfg.hidden, cfg.ffn, cfg.blocks, cfg.tokens, o.ranks, o.microbatches, o.steps,
      pipeline_train::adam{}.lr);

  // Simulations assume a processor per rank; thread ranks that outnumber the cores also wait for
  // a core, which the measured timelines show as extra idle time.
  if (auto const cores = std::thread::hardware_concurrency(); cores > 0 && cores < sz(o.ranks))
    std::printf(
        "note: %d ranks share %u hardware threads, so measured timelines include waiting for a "
        "core\n",
        o.ranks, cores);

  std::vector<run_result> runs;
  try {
    for (auto& [name, lowered] : programs) {
      int const stages = lowered.num_stages();
      std::printf("\n%s: %d stages (%d block%s each)%s\n", name.c_str(), stages,
                  cfg.blocks / stages, cfg.blocks / stages == 1 ? "" : "s",
                  lowered.vocab() != pl::vocab_variant::none ? ", vocabulary-parallel" : "");
      runs.push_back(train(name, lowered, cfg, o));
      auto const& r = runs.back();
      for (int k = 0; k < o.steps; ++k)
        std::printf("  step %d  loss %.6g  makespan %.2f ms\n", k + 1, r.losses[sz(k)],
                    ms(r.steps[sz(k)].makespan));
      // The last step against the simulator fed with the op times it measured.
      auto const measured = pl::as_simulation(r.lowered, r.steps.back());
      auto const predicted = pl::simulate(r.lowered, pl::fit_costs(r.lowered, r.steps.back()));
      std::printf(
          "  last step: compute makespan %.2f ms measured, %.2f ms simulated from its op times; "
          "bubble %.0f%% measured, %.0f%% simulated\n",
          measured.makespan, predicted.makespan, 100.0 * measured.bubble_rate,
          100.0 * predicted.bubble_rate);
      // Activation memory: the most (stage, microbatch) activations a rank held, in blocks (a
      // stage of a 2-chunk schedule holds half the blocks of a 1-chunk one).
      auto const& held = measured.peak_in_flight;
      auto const most = std::max_element(held.begin(), held.end());
      std::printf("  activations held at most: %d microbatch-blocks (rank %d)\n",
                  *most * (cfg.blocks / stages), static_cast<int>(most - held.begin()));
      if (!o.svg_dir.empty()) write_svg(r, o.svg_dir);
    }
  } catch (std::exception const& e) {
    std::cerr << "pipeline_train: training failed: " << e.what() << "\n";
    return 1;
  }

  // Every schedule runs the same model on the same data: the plain ones add every gradient in
  // the same order (microbatch by microbatch, token by token), so their losses are equal bit for
  // bit at every step; the vocabulary ones combine the output layer's softmax across shards (C0)
  // and differ in the last bits, which Adam carries into later steps. The check divides by
  // max(loss, 1): once training drives the loss towards 0 it is a difference of nearly equal
  // fp32 logits whose rounding error does not shrink with it (after 200 steps the loss is 4e-6
  // and the vocabulary runs differ by 1e-3 of it), so below 1 it is compared absolutely.
  std::printf("\nfinal loss (step %d) per schedule, first step's in brackets:\n", o.steps);
  int failures = 0;
  run_result const& ref = runs.front();
  run_result const* first_plain = nullptr;
  int plain_runs = 0;
  double worst_plain = 0.0, worst_vocab = 0.0, worst_checked = 0.0;
  bool plain_bitwise = true;
  for (auto const& r : runs) {
    double const first = r.losses.front(), last = r.losses.back(), want = ref.losses.back();
    double const rel = std::abs(last - want) / std::abs(want);
    worst_checked = std::max(worst_checked, std::abs(last - want) / std::max(std::abs(want), 1.0));
    bool const fell = last < first;
    std::printf("  %-12s %-10.6g (%.6g)  relative difference from %s %.2e%s\n", r.name.c_str(),
                last, first, ref.name.c_str(), rel, fell ? "" : "  LOSS DID NOT FALL");
    if (!fell) ++failures;
    if (r.lowered.vocab() != pl::vocab_variant::none) {
      worst_vocab = std::max(worst_vocab, rel);
      continue;
    }
    worst_plain = std::max(worst_plain, rel);
    ++plain_runs;
    if (first_plain == nullptr) first_plain = &r;
    for (int k = 0; k < o.steps; ++k)
      plain_bitwise &= std::bit_cast<std::uint64_t>(r.losses[sz(k)]) ==
                       std::bit_cast<std::uint64_t>(first_plain->losses[sz(k)]);
  }
  constexpr double tolerance = 1e-4;
  if (runs.size() < 2) {
    std::printf("one schedule: nothing to compare\n");
  } else {
    std::printf(
        "largest relative difference of the final losses: %.2e (plain schedules %.2e, "
        "vocabulary-parallel %.2e); relative to max(loss, 1): %.2e, tolerance %.0e\n",
        std::max(worst_plain, worst_vocab), worst_plain, worst_vocab, worst_checked, tolerance);
    if (worst_checked > tolerance) ++failures;
  }
  if (plain_runs >= 2) {
    std::printf("plain schedules' losses equal bit for bit at every step: %s\n",
                plain_bitwise ? "yes" : "NO");
    if (!plain_bitwise) ++failures;
  }
  std::printf("%s\n", failures == 0 ? "ok: every schedule trained the same model, and the loss fell"
                                    : "FAILED");
  return failures == 0 ? 0 : 1;
}
