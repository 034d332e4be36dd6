// tests/comm/mpi/fault_program.cpp — a small MPI program that provokes one fault, run under mpiexec
// by CTest: `skip <op>` (the last rank never calls <op>; the others wait 200 ms and throw
// timeout_error) or `mismatch` (debug fingerprints on; rank 0 calls all_reduce, the others
// all_gather: every rank throws mismatch_error). An uncaught comm_error ends the job with
// MPI_Abort(3), as a real program's main would; the test expects the message and a non-zero exit.
#include <weft/comm/collectives.hpp>
#include <weft/comm/mpi/communicator.hpp>

#include <mpi.h>
#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

namespace {

// CPU time of the calling thread, to show that waiting for a missing peer does not spin.
long long thread_cpu_ms() {
  rusage u{};
  getrusage(RUSAGE_THREAD, &u);
  return (u.ru_utime.tv_sec + u.ru_stime.tv_sec) * 1000LL +
         (u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1000;
}

using clock_type = std::chrono::steady_clock;

void run_op(weft::comm::mpi::communicator& c, std::string const& op) {
  std::vector<float> v(8, 1.0f);
  std::vector<float> all(8 * static_cast<std::size_t>(c.size()));
  if (op == "all_reduce") {
    weft::comm::all_reduce(c, v);
  } else if (op == "reduce") {  // the root waits for every contribution
    weft::comm::reduce(c, v, 0);
  } else if (op == "all_gather") {
    weft::comm::all_gather(c, v, all);
  } else if (op == "barrier") {
    weft::comm::barrier(c);
  } else if (op == "recv") {  // rank 0 waits for a message the last rank never sends
    if (c.rank() == 0) weft::comm::recv(c, v, c.size() - 1);
  } else {
    std::fprintf(stderr, "unknown op %s\n", op.c_str());
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  std::string const mode = argc > 1 ? argv[1] : "";
  std::string const op = argc > 2 ? argv[2] : "all_reduce";
  auto t0 = clock_type::now();
  long long cpu0 = 0;
  try {
    weft::comm::mpi::options o;
    o.timeout = std::chrono::milliseconds(200);
    o.check_fingerprints = mode == "mismatch";
    auto c = weft::comm::mpi::communicator::world(o);
    weft::comm::barrier(c);  // everyone is up: the clock starts now
    t0 = clock_type::now();
    cpu0 = thread_cpu_ms();
    if (mode == "skip") {
      if (c.rank() == c.size() - 1) {
        std::this_thread::sleep_for(std::chrono::seconds(10));  // the missing rank
      } else {
        run_op(c, op);
        // Ranks whose part completed without the missing rank (a reduce's non-roots send and
        // leave) meet it at a barrier next, and time out there.
        weft::comm::barrier(c);
      }
    } else if (mode == "mismatch") {
      std::vector<float> v(4, 1.0f);
      std::vector<float> all(4 * static_cast<std::size_t>(c.size()));
      if (c.rank() == 0)
        weft::comm::all_reduce(c, v);
      else
        weft::comm::all_gather(c, v, all);
    } else {
      std::fprintf(stderr, "usage: fault_program skip <op> | mismatch\n");
      MPI_Abort(MPI_COMM_WORLD, 2);
    }
  } catch (weft::comm_error const& e) {
    auto const ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(clock_type::now() - t0).count();
    std::fprintf(stderr, "rank %d threw after %lld ms (%lld ms of CPU): %s\n", rank,
                 static_cast<long long>(ms), thread_cpu_ms() - cpu0, e.what());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 3);  // the program's decision, never weft's
  }
  std::fprintf(stderr, "rank %d: no fault happened\n", rank);
  MPI_Finalize();
  return 0;
}
