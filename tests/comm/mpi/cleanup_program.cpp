// tests/comm/mpi/cleanup_program.cpp — after a timeout_error a surviving rank can clean up and
// exit. Usage: cleanup_program late|missing abort|return [all_reduce|send]
//   late:    the last rank takes part 1 s late; missing: it never does (under `return` it hangs
//            2 s, then goes to MPI_Finalize). The others give up after 200 ms (timeout_error).
//   abort:   rank 0 ends the job with MPI_Abort(3) (the recommended pattern when a peer may
//            never come back) once it has reported its timeout. Every other process waits to be
//            killed by that abort (10 s, then it aborts too) and never enters MPI_Finalize:
//            - if another survivor aborted at once, it could kill rank 0 before rank 0's report,
//              which the test's expected output names (seen under load at np 3);
//            - a process inside MPI_Finalize while the job aborts makes Open MPI 4.1's mpiexec
//              crash in PMIx_server_finalize or hang (seen under load at np 3, 7 runs in 60:
//              a launcher fault, not one of weft's).
//   return:  every survivor frees its buffers, destroys its communicator and returns from main,
//            which finalizes MPI (weft::comm::mpi::environment) and exits 0.
//   send:    instead of an all_reduce, rank 0 sends 1 MiB to the last rank (rendezvous protocol:
//            the data moves only once the receive is posted, late).
// A request MPI cannot cancel stays posted after the deadline; before options::own_buffers it
// wrote the late peer's data into the freed `out` vector inside MPI_Finalize (SIGSEGV).
#include <weft/comm/collectives.hpp>
#include <weft/comm/mpi/communicator.hpp>

#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

int main(int argc, char** argv) {
  std::string const when = argc > 1 ? argv[1] : "late";
  std::string const then = argc > 2 ? argv[2] : "return";
  std::string const what = argc > 3 ? argv[3] : "all_reduce";
  int rank = 0;
  {
    weft::comm::mpi::environment env(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    {
      weft::comm::mpi::options o;
      o.timeout = std::chrono::milliseconds(200);
      auto c = weft::comm::mpi::communicator::world(o);
      weft::comm::barrier(c);
      int const last = c.size() - 1;
      bool const takes_part = what == "all_reduce" || c.rank() == 0 || c.rank() == last;
      try {
        if (!takes_part) {
        } else if (c.rank() == last && when == "missing") {
          // Never calls it: hung for 2 s, then finalizes (`return`; under `abort` it waits below).
          std::this_thread::sleep_for(std::chrono::seconds(2));
        } else {
          if (c.rank() == last) std::this_thread::sleep_for(std::chrono::seconds(1));
          std::vector<float> in(1 << 18, 1.0f);  // 1 MiB: freed memory goes back to the system
          std::vector<float> out(1 << 18, 0.0f);
          if (what == "all_reduce") {
            weft::comm::all_reduce(c, in, out);
          } else if (c.rank() == 0) {
            weft::comm::send(c, in, last);
          } else {
            weft::comm::recv(c, out, 0);
          }
          std::fprintf(stderr, "rank %d: %s completed\n", rank, what.c_str());
        }
      } catch (weft::timeout_error const& e) {
        std::fprintf(stderr, "rank %d: timeout_error: %s\n", rank, e.what());
        std::fflush(stderr);
      }
      // Under `abort`, whichever way a rank got here (timed out, never called, did not take
      // part): rank 0 aborts; the others wait to be killed by it, and abort themselves after 10 s.
      if (then == "abort") {
        if (rank != 0) std::this_thread::sleep_for(std::chrono::seconds(10));
        MPI_Abort(MPI_COMM_WORLD, 3);
      }
    }  // the vectors went first, now the communicator
  }    // MPI_Finalize
  std::fprintf(stderr, "weft-cleanup: rank %d exits\n", rank);
  return 0;
}
