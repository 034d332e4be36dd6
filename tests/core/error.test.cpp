// Tests for weft/core/error.hpp: the hierarchy, codes, locations and message contents.
#include <weft/core/error.hpp>

#include <doctest/doctest.h>

#include <string>
#include <vector>

namespace {

void needs_positive(int count) { WEFT_EXPECTS(count > 0, "count", "> 0", count); }

void needs_rank(int rank) { WEFT_EXPECTS_SHAPE(rank == 2, "tensor rank", 2, rank); }

// A member template of a class template: its full signature carries every template argument.
template <class T>
struct holder {
  template <class F, class G>
  std::vector<T> const& check(int count, F&&, G const&) const {
    WEFT_EXPECTS(count > 0, "count", "> 0", count);
    static std::vector<T> none;
    return none;
  }
};

}  // namespace

TEST_CASE("error: WEFT_EXPECTS names the argument, the expected and the actual value") {
  CHECK_NOTHROW(needs_positive(3));
  try {
    needs_positive(-7);
    FAIL("expected an exception");
  } catch (weft::invalid_argument_error const& e) {
    std::string const what = e.what();
    CHECK(e.code() == weft::errc::invalid_argument);
    CHECK(what.find("`count`") != std::string::npos);
    CHECK(what.find("expected > 0") != std::string::npos);
    CHECK(what.find("actual -7") != std::string::npos);
    CHECK(what.find("count > 0") != std::string::npos);
    // The location is the checking function's, taken in the macro.
    CHECK(std::string(e.where().function_name()).find("needs_positive") != std::string::npos);
    CHECK(std::string(e.where().file_name()).find("error.test.cpp") != std::string::npos);
  }
}

TEST_CASE("error: shape_error is an invalid_argument_error and a weft::error") {
  CHECK_THROWS_AS(needs_rank(3), weft::shape_error);
  CHECK_THROWS_AS(needs_rank(3), weft::invalid_argument_error);
  CHECK_THROWS_AS(needs_rank(3), weft::error);
  CHECK_THROWS_WITH_AS(needs_rank(3), doctest::Contains("expected 2, actual 3"), weft::shape_error);
  try {
    needs_rank(1);
  } catch (weft::error const& e) {
    CHECK(e.code() == weft::errc::shape);
    CHECK(e.message().find("tensor rank") != std::string::npos);
  }
}

TEST_CASE("error: the comm hierarchy carries its payload") {
  weft::timeout_error t("all_reduce waited 200 ms", {1, 3});
  CHECK(t.code() == weft::errc::timeout);
  CHECK(t.missing_ranks() == std::vector<int>{1, 3});
  weft::comm_error const& as_comm = t;
  CHECK(as_comm.code() == weft::errc::timeout);

  weft::peer_aborted_error p("rank 2 threw", 2);
  CHECK(p.origin_rank() == 2);
  CHECK(p.code() == weft::errc::peer_aborted);

  weft::backend_error b("ncclSystemError", "nccl", 2);
  CHECK(b.backend() == "nccl");
  CHECK(b.backend_code() == 2);
  CHECK(b.code() == weft::errc::backend);

  CHECK_THROWS_AS(throw weft::mismatch_error("op differs"), weft::comm_error);
  CHECK_THROWS_AS(throw weft::schedule_error("rank 0 action 3"), weft::error);
  CHECK(weft::to_string(weft::errc::mismatch) == "mismatch");
}

TEST_CASE("error: WEFT_THROW streams its arguments") {
  try {
    WEFT_THROW(weft::schedule_error, "rank ", 1, " action ", 4, ": recv before send");
  } catch (weft::schedule_error const& e) {
    CHECK(e.message() == "rank 1 action 4: recv before send");
    CHECK(std::string(e.what()).rfind("weft: rank 1", 0) == 0);
  }
}

TEST_CASE("error: what() ends with a short location, not a whole template signature") {
  try {
    holder<std::vector<double>>{}.check(
        -1, [](int) {}, std::string("x"));
    FAIL("expected an exception");
  } catch (weft::invalid_argument_error const& e) {
    std::string const what = e.what();
    // clang 14 with libstdc++ 12 has no std::source_location; weft's fallback builtin gives the
    // bare function name ("check"), so the short form there is the bare name.
    bool const qualified = std::string(e.where().function_name()).find("::") != std::string::npos;
    std::string const expected = "[at error.test.cpp:" + std::to_string(e.where().line()) +
                                 (qualified ? " in holder::check]" : " in check]");
    CHECK(what.size() >= expected.size());
    CHECK(what.substr(what.size() - expected.size()) == expected);
    CHECK(what.find("with ") == std::string::npos);
    CHECK(what.find("std::") == std::string::npos);
    // where() keeps the full location for whoever wants it.
    CHECK(std::string(e.where().function_name()).find("check") != std::string::npos);
  }
  try {
    needs_positive(0);
  } catch (weft::error const& e) {
    std::string const what = e.what();
    CHECK(what.substr(what.rfind(" [at ")) ==
          " [at error.test.cpp:" + std::to_string(e.where().line()) + " in needs_positive]");
  }
  CHECK(weft::error::short_file("/usr/local/include/weft/comm/threads/communicator.hpp") ==
        "weft/comm/threads/communicator.hpp");
  CHECK(weft::error::short_file("/src/app/train.cpp") == "train.cpp");
  CHECK(
      weft::error::short_function(
          "void weft::comm::threads::communicator::run(call&, P&&, B&&) [with P = std::nullptr_t; "
          "B = weft::comm::threads::communicator::all_reduce(buffer_view, buffer_view, reduce_op, "
          "op_options)::<lambda(uint64_t)>]") == "communicator::run");
  CHECK(weft::error::short_function(
            "std::vector<int> const& weft::a::b<T>::c(int) const [T = int]") == "b::c");
  CHECK(weft::error::short_function("bool weft::x::operator()(int) const") == "x::operator()");
  CHECK(weft::error::short_function("needs_positive") == "needs_positive");
  CHECK(weft::error::short_function("operator()") == "operator()");
  // nvcc names an anonymous namespace after the translation unit; it is dropped like the others.
  CHECK(weft::error::short_function("void _GLOBAL__N__44c882a6_13_error_test_cu_737cdf09_19905::"
                                    "needs_positive(int)") == "needs_positive");
  CHECK(weft::error::short_function("void {anonymous}::needs_positive(int)") == "needs_positive");
}
