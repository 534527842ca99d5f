// Defining and calling kernels: `auto k = deuteron::kernel("name", lambda); k(x, y);`
#pragma once

#include <array>
#include <functional>
#include <memory>
#include <optional>
#include <source_location>
#include <string>
#include <tuple>
#include <utility>
#include <variant>
#include <vector>

#include "deuteron/hl.h"
#include "deuteron/tensor.h"

namespace deuteron {

// What a kernel is called with: a host tensor or a number.
using Arg = std::variant<Tensor, double, int64_t>;

// A kernel's results; converts to a Tensor when there is exactly one.
struct Outputs : std::vector<Tensor> {
  using std::vector<Tensor>::vector;
  operator Tensor() const;  // NOLINT: implicit, so `Tensor z = add(x, y);` reads naturally
};

// Every member has an initializer, so `KernelOptions{.effort = "none"}` is quiet under -Wextra.
struct KernelOptions {
  // A config to use for every shape, as JSON (as printed by `deuteron tune`); pins it.
  std::string config = {};
  // Autotuning effort on the first call for a new shape: "none", "quick" or "full".
  std::string effort = "quick";
  // The time tuning a new shape may take, in seconds; 0: the effort's (quick 50, full 600).
  double tune_budget_s = 0;
  // Names of the arguments, for readable generated code and errors (optional).
  std::vector<std::string> arg_names = {};
  // How hl::atomic_add sums floats on the CPU, as torch.use_deterministic_algorithms chooses:
  // "ordered": each thread adds into its own copy of the target and the copies are summed in
  // thread order, so a config gives the same bits on every run; "atomic": atomic adds, whose
  // order (and last bits) vary from run to run; "auto" (the default): ordered where the copies
  // take at most 1 MiB per thread. DEUTERON_DETERMINISTIC=1 (ordered) or 0 (atomic) overrides.
  std::string atomic_add = "auto";
  // The target a call compiles for and runs on: "cpu", "pallas" or "triton" (those the build
  // has); empty: the first built in (cpu). Pallas runs on a TPU or under JAX's interpret mode,
  // triton on a CUDA GPU or under DEUTERON_TRITON_DEVICE=interpret (see the README's targets).
  std::string target = {};
};

namespace hl::detail {
// The symbolic argument `index` of the kernel being traced.
Tensor argument(int index);
// Records the values a kernel returns.
void set_outputs(const std::vector<Tensor>& outs, std::source_location loc);
}  // namespace hl::detail

// The type-erased part of a kernel: its name, how to trace it, its options.
class KernelBase {
 public:
  KernelBase(std::string name, int arity, std::function<void()> trace, KernelOptions options,
             std::source_location loc);
  const std::string& name() const { return name_; }
  int arity() const { return arity_; }
  const KernelOptions& options() const { return options_; }
  const std::source_location& location() const { return loc_; }
  // Runs the lambda on symbolic arguments (used by the frontend).
  void trace_body() const { trace_(); }
  // Specialises, picks a config (pinned, cached or tuned), compiles and runs on the options'
  // target (by default the first built in: cpu).
  Outputs run(const std::vector<Arg>& args) const;

 private:
  struct Runs;  // what run() prepared per specialisation (defined by the driver)
  std::string name_;
  int arity_;
  std::function<void()> trace_;
  KernelOptions options_;
  std::source_location loc_;
  mutable std::shared_ptr<Runs> runs_;  // shared by copies, which trace the same lambda
};

namespace detail {
template <typename T>
struct arity : arity<decltype(&T::operator())> {};
template <typename C, typename R, typename... A>
struct arity<R (C::*)(A...) const> : std::integral_constant<int, sizeof...(A)> {};
template <typename C, typename R, typename... A>
struct arity<R (C::*)(A...)> : std::integral_constant<int, sizeof...(A)> {};

inline void collect(std::vector<hl::Tensor>& out, const hl::Tensor& t) { out.push_back(t); }
template <typename... T>
void collect(std::vector<hl::Tensor>& out, const std::tuple<T...>& t) {
  std::apply([&](const auto&... x) { (out.push_back(x), ...); }, t);
}
template <typename A, typename B>
void collect(std::vector<hl::Tensor>& out, const std::pair<A, B>& t) {
  out.push_back(t.first);
  out.push_back(t.second);
}
inline void collect(std::vector<hl::Tensor>& out, const std::vector<hl::Tensor>& t) {
  out.insert(out.end(), t.begin(), t.end());
}

template <typename F, size_t... I>
void trace_call(const F& f, std::index_sequence<I...>, std::source_location loc) {
  // A braced list evaluates left to right, so arguments are made in order.
  std::array<hl::Tensor, sizeof...(I)> args{hl::detail::argument(int(I))...};
  std::vector<hl::Tensor> outs;
  collect(outs, f(args[I]...));
  hl::detail::set_outputs(outs, loc);
}
}  // namespace detail

template <typename F>
class Kernel : public KernelBase {
 public:
  Kernel(std::string name, F f, KernelOptions options, std::source_location loc)
      : KernelBase(
            std::move(name), detail::arity<F>::value,
            [f, loc] { detail::trace_call(f, std::make_index_sequence<detail::arity<F>::value>{}, loc); },
            std::move(options), loc) {}

  template <typename... A>
  Outputs operator()(const A&... args) const {
    return run(std::vector<Arg>{to_arg(args)...});
  }

 private:
  static Arg to_arg(const Tensor& t) { return t; }
  template <typename T, typename = std::enable_if_t<std::is_floating_point_v<T>>>
  static Arg to_arg(T x, int = 0) { return double(x); }
  template <typename T, typename = std::enable_if_t<std::is_integral_v<T>>>
  static Arg to_arg(T x, long = 0) { return int64_t(x); }
};

// Defines a kernel. The lambda takes hl::Tensor (or hl::Scalar) arguments and returns the
// output tensor(s) it allocated (one, or a std::tuple).
template <typename F>
Kernel<F> kernel(std::string name, F f, KernelOptions options = {},
                 std::source_location loc = std::source_location::current()) {
  return Kernel<F>(std::move(name), std::move(f), std::move(options), loc);
}

}  // namespace deuteron
