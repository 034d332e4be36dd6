// tests/comm/mpi/main.cpp — doctest's main for the MPI tests, run under mpiexec: every rank runs
// every case; only rank 0 reports; the exit code is the largest failure count over the ranks, and
// an uncaught comm_error ends the whole job with MPI_Abort (weft itself never calls it).
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <weft/core/error.hpp>

#include <mpi.h>

#include <cstdio>
#include <exception>
#include <string_view>

// A comm_error escaping a test case means this rank's communicator is dead while its peers may be
// blocked in a collective: end the job at once instead of letting them time out case by case.
// doctest translates every exception it catches (CHECK_THROWS included) but reports only those
// escaping a test case to test_case_exception, so the translation carries a marker the listener
// looks for.
constexpr char const* comm_error_marker = "uncaught weft::comm_error: ";

REGISTER_EXCEPTION_TRANSLATOR(weft::comm_error const& e) {
  return doctest::String(comm_error_marker) + e.what();
}

struct abort_on_comm_error : doctest::IReporter {
  explicit abort_on_comm_error(doctest::ContextOptions const&) {}
  void report_query(doctest::QueryData const&) override {}
  void test_run_start() override {}
  void test_run_end(doctest::TestRunStats const&) override {}
  void test_case_start(doctest::TestCaseData const&) override {}
  void test_case_reenter(doctest::TestCaseData const&) override {}
  void test_case_end(doctest::CurrentTestCaseStats const&) override {}
  void test_case_exception(doctest::TestCaseException const& e) override {
    std::string_view const text(e.error_string.c_str());
    if (text.rfind(comm_error_marker, 0) != 0) return;
    int rank = -1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    std::fprintf(stderr, "rank %d: %s\n", rank, e.error_string.c_str());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 3);
  }
  void subcase_start(doctest::SubcaseSignature const&) override {}
  void subcase_end() override {}
  void log_assert(doctest::AssertData const&) override {}
  void log_message(doctest::MessageData const&) override {}
  void test_case_skipped(doctest::TestCaseData const&) override {}
};
REGISTER_LISTENER("abort_on_comm_error", 1, abort_on_comm_error);

// The thread level the suite asks for: SERIALIZED (what weft's communicators need), or what the
// target defines (the pipeline's suite asks for MULTIPLE, under which the executor overlaps its
// vocabulary collectives on a second thread).
#ifndef WEFT_TEST_MPI_THREAD_LEVEL
#define WEFT_TEST_MPI_THREAD_LEVEL MPI_THREAD_SERIALIZED
#endif

int main(int argc, char** argv) {
  int provided = 0;
  if (MPI_Init_thread(&argc, &argv, WEFT_TEST_MPI_THREAD_LEVEL, &provided) != MPI_SUCCESS) return 2;
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  int failed = 0;
  try {
    doctest::Context context(argc, argv);
    if (rank != 0) context.setOption("out", "/dev/null");
    failed = context.run();
    if (context.shouldExit()) failed = 0;
  } catch (weft::comm_error const& e) {
    std::fprintf(stderr, "rank %d: uncaught %s\n", rank, e.what());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 3);
  }
  int worst = 0;
  MPI_Allreduce(&failed, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return worst != 0 ? 1 : 0;
}
