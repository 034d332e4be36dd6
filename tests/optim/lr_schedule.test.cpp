// Tests of weft/optim/lr_schedule.hpp: values of the constant, warmup and warmup + cosine
// schedules at known steps (Megatron's get_lr), and argument checks naming the argument.
#include "support/checks.hpp"
#include <weft/optim/lr_schedule.hpp>

#include <doctest/doctest.h>

#include <cmath>
#include <numbers>
#include <string>

namespace {
using weft::optim::lr_schedule;
using weft::test::close_rel;
using weft::test::has;
using weft::test::message_of;
}  // namespace

TEST_CASE("lr_schedule: constant") {
  auto const s = lr_schedule::constant(3e-4);
  for (std::int64_t k : {0, 1, 7, 1000000}) CHECK(s(k) == 3e-4);
}

TEST_CASE("lr_schedule: linear warmup then constant") {
  auto const s = lr_schedule::warmup(1e-3, 10);
  CHECK(s(0) == 0.0);
  CHECK(close_rel(s(1), 1e-4, 1e-15));
  CHECK(close_rel(s(5), 5e-4, 1e-15));
  CHECK(s(10) == 1e-3);
  CHECK(s(11) == 1e-3);
  auto const from = lr_schedule::warmup(1e-3, 4, 1e-4);  // init_lr + (max − init)·s/W
  CHECK(close_rel(from(2), 1e-4 + 9e-4 * 0.5, 1e-15));
  CHECK(lr_schedule::warmup(2e-3, 0)(0) == 2e-3);  // no warmup
}

TEST_CASE("lr_schedule: warmup then cosine decay to min_lr") {
  auto const s = lr_schedule::cosine(1e-3, 1e-4, 10, 110);
  CHECK(close_rel(s(5), 5e-4, 1e-15));                   // warmup
  CHECK(s(10) == 1e-3);                                  // end of warmup
  CHECK(close_rel(s(35), 8.681980515339464e-4, 1e-14));  // ratio 1/4: 0.5(cos(π/4) + 1)
  CHECK(close_rel(s(60), 5.5e-4, 1e-14));                // halfway: (max + min)/2
  CHECK(close_rel(s(110), 1e-4, 1e-14));                 // end of decay
  CHECK(s(111) == 1e-4);
  CHECK(s(1000000) == 1e-4);
  for (std::int64_t k = 10; k < 110; ++k) CHECK(s(k + 1) <= s(k));  // monotone decay
  // No warmup: torch's CosineAnnealingLR closed form, eta_min + (base − eta_min)(1 +
  // cos(πT/Tmax))/2.
  auto const c = lr_schedule::cosine(0.1, 0.0, 0, 50);
  for (std::int64_t k : {0, 1, 13, 25, 49})
    CHECK(close_rel(c(k), 0.1 * (1 + std::cos(std::numbers::pi * static_cast<double>(k) / 50)) / 2,
                    1e-14));
  CHECK(c(50) == 0.0);  // cos(π) = −1 exactly: the rate reaches min_lr = 0
}

TEST_CASE("lr_schedule: bad arguments throw naming the argument, expected and actual") {
  auto const m1 = message_of([] { (void)lr_schedule::cosine(1e-3, 2e-3, 10, 100); });
  CHECK(has(m1, "argument `min_lr`"));
  CHECK(has(m1, "in [0, max_lr = 0.001]"));
  CHECK(has(m1, "actual 0.002"));
  auto const m2 = message_of([] { (void)lr_schedule::cosine(1e-3, 0.0, 10, 10); });
  CHECK(has(m2, "argument `decay_steps`"));
  CHECK(has(m2, "> warmup_steps = 10"));
  CHECK(has(m2, "actual 10"));
  CHECK(has(message_of([] { (void)lr_schedule::warmup(1e-3, -1); }), "argument `warmup_steps`"));
  CHECK(has(message_of([] { (void)lr_schedule::constant(-1.0); }), "argument `lr`"));
  CHECK(has(message_of([] { (void)lr_schedule::constant(1.0)(-1); }), "argument `step`"));
  CHECK_THROWS_AS((void)lr_schedule::constant(std::nan("")), weft::invalid_argument_error);
}
