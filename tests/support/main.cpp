// The one translation unit with doctest's implementation and main(); every test area links it.
// A run whose --test-case filter selects no case fails: CTest registers one test per case by
// name, and a name the filter no longer matches must not pass by running nothing.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <atomic>
#include <cstdio>
#include <cstring>

namespace {

std::atomic<int> cases_started{0};

struct case_counter : doctest::IReporter {
  explicit case_counter(doctest::ContextOptions const&) {}
  void report_query(doctest::QueryData const&) override {}
  void test_run_start() override {}
  void test_run_end(doctest::TestRunStats const&) override {}
  void test_case_start(doctest::TestCaseData const&) override { ++cases_started; }
  void test_case_reenter(doctest::TestCaseData const&) override {}
  void test_case_end(doctest::CurrentTestCaseStats const&) override {}
  void test_case_exception(doctest::TestCaseException const&) override {}
  void subcase_start(doctest::SubcaseSignature const&) override {}
  void subcase_end() override {}
  void log_assert(doctest::AssertData const&) override {}
  void log_message(doctest::MessageData const&) override {}
  void test_case_skipped(doctest::TestCaseData const&) override {}
};

}  // namespace

DOCTEST_REGISTER_LISTENER("weft_case_counter", 1, case_counter);

int main(int argc, char** argv) {
  doctest::Context context(argc, argv);
  int const result = context.run();
  if (context.shouldExit()) return result;  // --list-test-cases, --help, ...
  bool filtered = false;
  for (int i = 1; i < argc; ++i)
    if (std::strncmp(argv[i], "--test-case=", 12) == 0 || std::strncmp(argv[i], "-tc=", 4) == 0)
      filtered = true;
  if (filtered && cases_started.load() == 0) {
    std::fprintf(stderr, "weft test main: the --test-case filter selected no test case\n");
    return result == 0 ? 1 : result;
  }
  return result;
}
