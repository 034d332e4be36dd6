// weft/optim/lr_schedule.hpp — learning-rate schedules as Megatron's OptimizerParamScheduler
// computes them: constant, linear warmup then constant, linear warmup then cosine decay to a
// minimum.
#pragma once

#include <weft/core/error.hpp>

#include <cmath>
#include <cstdint>
#include <numbers>

namespace weft::optim {

//! A learning rate as a function of the step number s, Megatron's `num_steps`: the number of
//! optimizer steps taken including the one about to use the rate (1 for the first step; s = 0 is
//! allowed and gives init_lr under a warmup). With W = warmup_steps, D = decay_steps:
//! - constant:        lr(s) = max_lr.
//! - warmup_constant: lr(s) = init_lr + (max_lr − init_lr)·s/W  for s <= W (W > 0), then max_lr.
//! - warmup_cosine:   the same warmup, then for W < s <= D
//!                      lr(s) = min_lr + (max_lr − min_lr)·0.5·(cos(π·(s − W)/(D − W)) + 1),
//!                    and min_lr for s > D.
//! With W = 0 and init_lr unused, warmup_cosine is torch's CosineAnnealingLR closed form
//! (eta_min + (base − eta_min)(1 + cos(π·T_cur/T_max))/2 with T_cur = s, T_max = D).
//! Megatron computes exactly these expressions in double (get_lr, decay styles "constant" and
//! "cosine"); so does operator() here.
class lr_schedule {
 public:
  enum class kind : std::uint8_t { constant, warmup_constant, warmup_cosine };

  //! lr(s) = lr for every s; lr >= 0.
  [[nodiscard]] static lr_schedule constant(double lr) {
    WEFT_EXPECTS(lr >= 0.0, "lr", ">= 0", lr);
    return lr_schedule(kind::constant, lr, lr, 0, 0, 0.0);
  }

  //! Linear warmup from init_lr (at s = 0) to max_lr (at s = warmup_steps), then max_lr.
  //! max_lr >= 0, init_lr >= 0, warmup_steps >= 0.
  [[nodiscard]] static lr_schedule warmup(double max_lr, std::int64_t warmup_steps,
                                          double init_lr = 0.0) {
    WEFT_EXPECTS(max_lr >= 0.0, "max_lr", ">= 0", max_lr);
    WEFT_EXPECTS(init_lr >= 0.0, "init_lr", ">= 0", init_lr);
    WEFT_EXPECTS(warmup_steps >= 0, "warmup_steps", ">= 0", warmup_steps);
    return lr_schedule(kind::warmup_constant, max_lr, max_lr, warmup_steps, warmup_steps, init_lr);
  }

  //! Linear warmup over warmup_steps, then cosine decay to min_lr at decay_steps, then min_lr.
  //! 0 <= min_lr <= max_lr, init_lr >= 0, warmup_steps >= 0, decay_steps > warmup_steps.
  [[nodiscard]] static lr_schedule cosine(double max_lr, double min_lr, std::int64_t warmup_steps,
                                          std::int64_t decay_steps, double init_lr = 0.0) {
    WEFT_EXPECTS(max_lr >= 0.0, "max_lr", ">= 0", max_lr);
    WEFT_EXPECTS(min_lr >= 0.0 && min_lr <= max_lr, "min_lr",
                 ::weft::detail::concat("in [0, max_lr = ", max_lr, "]"), min_lr);
    WEFT_EXPECTS(init_lr >= 0.0, "init_lr", ">= 0", init_lr);
    WEFT_EXPECTS(warmup_steps >= 0, "warmup_steps", ">= 0", warmup_steps);
    WEFT_EXPECTS(decay_steps > warmup_steps, "decay_steps",
                 ::weft::detail::concat("> warmup_steps = ", warmup_steps), decay_steps);
    return lr_schedule(kind::warmup_cosine, max_lr, min_lr, warmup_steps, decay_steps, init_lr);
  }

  //! The rate for step s >= 0 (invalid_argument_error otherwise).
  [[nodiscard]] double operator()(std::int64_t s) const {
    WEFT_EXPECTS(s >= 0, "step", ">= 0", s);
    if (kind_ == kind::constant) return max_lr_;
    if (warmup_ > 0 && s <= warmup_)
      return init_lr_ +
             (max_lr_ - init_lr_) * static_cast<double>(s) / static_cast<double>(warmup_);
    if (kind_ == kind::warmup_constant) return max_lr_;
    if (s > decay_) return min_lr_;
    double const ratio = static_cast<double>(s - warmup_) / static_cast<double>(decay_ - warmup_);
    double const coeff = 0.5 * (std::cos(std::numbers::pi * ratio) + 1.0);
    return min_lr_ + coeff * (max_lr_ - min_lr_);
  }

  [[nodiscard]] kind which() const noexcept { return kind_; }
  [[nodiscard]] double max_lr() const noexcept { return max_lr_; }
  [[nodiscard]] double min_lr() const noexcept { return min_lr_; }
  [[nodiscard]] double init_lr() const noexcept { return init_lr_; }
  [[nodiscard]] std::int64_t warmup_steps() const noexcept { return warmup_; }
  [[nodiscard]] std::int64_t decay_steps() const noexcept { return decay_; }

 private:
  lr_schedule(kind k, double max_lr, double min_lr, std::int64_t warmup, std::int64_t decay,
              double init_lr)
      : kind_(k),
        max_lr_(max_lr),
        min_lr_(min_lr),
        init_lr_(init_lr),
        warmup_(warmup),
        decay_(decay) {}

  kind kind_;
  double max_lr_, min_lr_, init_lr_;
  std::int64_t warmup_, decay_;
};

}  // namespace weft::optim
