// The pipeline executor over MPI processes (label mpi; run under mpiexec by CMakeLists.txt here):
// the model of executor_model.hpp, one pipeline rank per process, under 1F1B and the
// vocabulary-balanced schedules (1 and 2 barriers) gives the loss and gradients of sequential
// gradient accumulation on one rank bit for bit (1F1B; and one full-batch step within 1e-5), or
// the single-device vocabulary model within fp32 tolerances. Every process computes the references
// itself and checks its own stages, so nothing but the step crosses processes. A stage that throws
// on one process makes every process throw within 2 s of the deadline, each naming the rank,
// action and microbatch that failed first (exchange_failures: MPI's abort cannot wake the peers).
#include <weft/comm/mpi/communicator.hpp>
#include <weft/pipeline/executor.hpp>
#include <weft/pipeline/lower.hpp>
#include <weft/pipeline/schedules/one_f_one_b.hpp>
#include <weft/pipeline/schedules/vocab.hpp>
#include <weft/pipeline/validate.hpp>

#include "pipeline/executor_model.hpp"

#include <doctest/doctest.h>

#include <bit>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

using namespace weft::test::pipeline_model;
namespace mpi = weft::comm::mpi;

static_assert(pl::PipelineCommunicator<mpi::communicator>);

namespace {

mpi::options with_timeout(std::chrono::milliseconds t) {
  mpi::options o;
  o.timeout = t;
  return o;
}

void check_one_f_one_b(int m) {
  auto c = mpi::communicator::world(with_timeout(std::chrono::seconds(30)));
  int const p = c.size();
  CAPTURE(p);
  CAPTURE(m);
  auto const compute = pl::one_f_one_b(p, m, pl::generator_options{m < p});
  auto const lowered = pl::lower(compute);
  pl::validate(lowered);
  data_set const data(m);
  pl::step_options opt;
  for (int i = 0; i < m; ++i) opt.tokens.push_back(static_cast<std::size_t>(rows_of(i) * head_out));
  auto const weights = pl::loss_weights(opt, m);

  mlp_stage stage(lowered, c.rank(), data);
  auto const res = pl::run_step(lowered, stage, c, opt);

  auto const ref = sequential_reference(p, m, weights, data);
  auto const whole = full_batch_reference(p, m, weights, data);
  bool const last = c.rank() == p - 1;
  CHECK(res.has_loss == last);
  if (last) {
    CHECK(std::bit_cast<std::uint64_t>(res.loss) == std::bit_cast<std::uint64_t>(ref.loss));
    CHECK(res.loss == doctest::Approx(whole.loss).epsilon(1e-5));
    CHECK(ref.loss > 0.0);
  }
  REQUIRE(stage.chunks_.size() == 1);
  auto const& ch = stage.chunks_[0];
  CHECK(ch.stage == c.rank());
  auto const& want = ref.stages[static_cast<std::size_t>(ch.stage)];
  auto const& full = whole.stages[static_cast<std::size_t>(ch.stage)];
  REQUIRE(ch.layers.size() == want.size());
  for (std::size_t l = 0; l < want.size(); ++l) {
    CAPTURE(l);
    CHECK(same_bits(ch.layers[l].gw, want[l].gw));
    CHECK(same_bits(ch.layers[l].gb, want[l].gb));
    CHECK(close_rel(ch.layers[l].gw, full[l].gw, 1e-5));
    CHECK(close_rel(ch.layers[l].gb, full[l].gb, 1e-5));
  }
  CHECK(res.timeline.size() == lowered.actions(c.rank()).size());
}

void check_vocab_mpi(pl::vocab_variant variant, int m, bool overlap) {
  auto c = mpi::communicator::world(with_timeout(std::chrono::seconds(30)));
  auto vc = mpi::communicator::dup(MPI_COMM_WORLD, with_timeout(std::chrono::seconds(30)));
  int const p = c.size();
  CAPTURE(pl::to_string(variant));
  CAPTURE(p);
  CAPTURE(m);
  CAPTURE(overlap);
  pl::vocab_options vo;
  vo.unchecked = m < p;
  auto const compute = pl::vocab_one_f_one_b(p, m, variant, vo);
  auto const lowered = pl::lower(compute);
  pl::validate(lowered);
  int const stages = compute.num_stages();
  data_set const data(m);
  vocab_data const vd(m);
  pl::step_options opt;
  for (int i = 0; i < m; ++i) opt.tokens.push_back(static_cast<std::size_t>(rows_of(i)));
  auto const weights = pl::loss_weights(opt, m);

  mlp_stage stage(lowered, c.rank(), data, true);
  vocab_shard shard(c.rank(), p, vd);
  auto plan = pl::prepare_step(lowered, c.rank(), stage, shard);
  auto run_opt = opt;
  run_opt.vocab_overlap = overlap;
  auto const res = pl::run_step(plan, stage, shard, c, vc, run_opt);
  // The suite runs under MPI_THREAD_MULTIPLE (tests/pipeline/mpi/CMakeLists.txt).
  CHECK(c.allows_concurrent_calls());
  CHECK(res.metrics.vocab_overlapped == overlap);

  auto const ref = vocab_reference(stages, m, weights, vd);
  int const last_rank = compute.stage_to_rank(stages - 1);
  CHECK(res.has_loss == (c.rank() == last_rank));
  if (res.has_loss) CHECK(res.loss == doctest::Approx(ref.loss).epsilon(1e-5));
  for (auto const& ch : stage.chunks_) {
    CAPTURE(ch.stage);
    auto const& want = ref.stages[static_cast<std::size_t>(ch.stage)];
    for (std::size_t l = 0; l < want.size(); ++l) {
      CAPTURE(l);
      CHECK(close(ch.layers[l].gw, want[l].gw));
      CHECK(close(ch.layers[l].gb, want[l].gb));
    }
  }
  auto const& sh = shard.tables_;
  auto const first = static_cast<std::ptrdiff_t>(sh.lo * width);
  auto const count = static_cast<std::ptrdiff_t>((sh.hi - sh.lo) * width);
  std::vector<float> const ref_ge(ref.tables.ge.begin() + first,
                                  ref.tables.ge.begin() + first + count);
  std::vector<float> const ref_gw(ref.tables.gw.begin() + first,
                                  ref.tables.gw.begin() + first + count);
  CHECK(close(sh.ge, ref_ge));
  CHECK(close(sh.gw, ref_gw));
}

// Runs `step` on every process at once (after a barrier): it must throw a weft::error within the
// deadline plus the 2 s the acceptance allows; returns the message.
template <class F>
std::string fails_in_time(std::chrono::milliseconds deadline, F&& step) {
  using namespace std::chrono_literals;
  MPI_Barrier(MPI_COMM_WORLD);
  auto const t0 = std::chrono::steady_clock::now();
  std::string msg;
  bool threw = false;
  try {
    step();
  } catch (weft::error const& e) {
    threw = true;
    msg = e.what();
  }
  auto const elapsed = std::chrono::steady_clock::now() - t0;
  CAPTURE(msg);
  CHECK(threw);
  CHECK(elapsed < deadline + 2s);
  return msg;
}

}  // namespace

TEST_CASE("pipeline over MPI: 1F1B equals sequential accumulation bit for bit") {
  int world = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  for (int m : {1, world, 2 * world + 1}) check_one_f_one_b(m);
}

TEST_CASE("pipeline over MPI: the vocabulary-balanced schedules match the single-device model") {
  int world = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  for (auto variant : {pl::vocab_variant::one_barrier, pl::vocab_variant::two_barrier})
    for (int m : {1, world, 2 * world + 1})
      for (bool overlap : {true, false}) check_vocab_mpi(variant, m, overlap);
}

// The communicators end poisoned and leave abandoned requests to MPI_Finalize, so CMake runs this
// case in a job of its own.
TEST_CASE("pipeline over MPI: a stage that throws on one rank raises on every rank, naming it") {
  using namespace std::chrono_literals;
  auto const deadline = 1000ms;
  auto c = mpi::communicator::world(with_timeout(deadline));
  auto reports = mpi::communicator::dup(MPI_COMM_WORLD, with_timeout(deadline));
  int const p = c.size();
  int const m = 4;
  int const failing = p - 1;  // the last stage's forward of microbatch 1: every rank waits on it
  auto const lowered = pl::lower(pl::one_f_one_b(p, m));
  data_set const data(m);
  mlp_stage stage(lowered, c.rank(), data);
  stage.fail_at = [&](pl::stage_call const& call, char const* what) {
    return call.stage == failing && call.microbatch == 1 && std::string(what) == "forward";
  };
  pl::step_options opt;
  opt.report_failure = pl::exchange_failures(reports);
  auto const msg = fails_in_time(deadline, [&] { (void)pl::run_step(lowered, stage, c, opt); });
  CAPTURE(msg);
  // Every rank names the failing rank, its action and microbatch, and the stage's own error.
  std::string const origin = "pipeline rank " + std::to_string(failing);
  std::string const action = "`" + std::to_string(failing) + "F1`";
  CHECK(msg.find(origin) != std::string::npos);
  CHECK(msg.find(action) != std::string::npos);
  CHECK(msg.find("microbatch 1") != std::string::npos);
  CHECK(msg.find("injected stage failure") != std::string::npos);
  if (c.rank() != failing)
    CHECK(msg.find("rank " + std::to_string(failing) + " reported") != std::string::npos);
}

// The same under a vocabulary-balanced schedule with overlapped collectives: the failing rank's
// S pass throws while the other ranks' progress threads wait in its collectives (MPI cannot wake
// them: they time out, and the exchanged reports name the origin).
TEST_CASE("pipeline over MPI: a vocabulary pass that throws on one rank raises on every rank") {
  using namespace std::chrono_literals;
  auto const deadline = 1000ms;
  auto c = mpi::communicator::world(with_timeout(deadline));
  auto vc = mpi::communicator::dup(MPI_COMM_WORLD, with_timeout(deadline));
  auto reports = mpi::communicator::dup(MPI_COMM_WORLD, with_timeout(deadline));
  int const p = c.size();
  int const m = 4;
  int const failing = p - 1;
  auto const lowered = pl::lower(pl::vocab_one_f_one_b(p, m, pl::vocab_variant::one_barrier));
  data_set const data(m);
  vocab_data const vd(m);
  mlp_stage stage(lowered, c.rank(), data, true);
  vocab_shard shard(c.rank(), p, vd);
  shard.fail_at = [&](pl::stage_call const& call) {
    return call.stage == failing && call.microbatch == 1;
  };
  pl::step_options opt;
  opt.report_failure = pl::exchange_failures(reports);
  auto plan = pl::prepare_step(lowered, c.rank(), stage, shard);
  auto const msg =
      fails_in_time(deadline, [&] { (void)pl::run_step(plan, stage, shard, c, vc, opt); });
  CAPTURE(msg);
  std::string const origin = "pipeline rank " + std::to_string(failing);
  std::string const action = "`" + std::to_string(failing) + "S1`";
  CHECK(msg.find(origin) != std::string::npos);
  CHECK(msg.find(action) != std::string::npos);
  CHECK(msg.find("injected vocabulary failure") != std::string::npos);
  if (c.rank() != failing)
    CHECK(msg.find("rank " + std::to_string(failing) + " reported") != std::string::npos);
}
