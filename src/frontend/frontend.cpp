#include "frontend/frontend.h"

#include <cstdlib>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace deuteron {

Outputs::operator Tensor() const {
  if (size() != 1)
    throw ArgumentError(fmt::format("the kernel returned {} tensors, not one", size()), "",
                        "index the outputs: auto outs = k(x); outs[0]");
  return front();
}

KernelBase::KernelBase(std::string name, int arity, std::function<void()> trace,
                       KernelOptions options, std::source_location loc)
    : name_(std::move(name)), arity_(arity), trace_(std::move(trace)),
      options_(std::move(options)), loc_(loc) {}

}  // namespace deuteron

namespace deuteron::frontend {

namespace {
// The arguments of the trace in progress (one per thread, like the tracer itself).
thread_local const std::vector<ArgSpec>* g_args = nullptr;
}  // namespace

std::vector<ArgSpec> describe_args(const KernelBase& k, const std::vector<Arg>& args) {
  if (int(args.size()) != k.arity())
    throw ArgumentError(fmt::format("kernel '{}' takes {} arguments, got {}", k.name(), k.arity(),
                                    args.size()),
                        format_location(k.location()));
  std::vector<ArgSpec> specs;
  for (size_t i = 0; i < args.size(); ++i) {
    ArgSpec s;
    if (i < k.options().arg_names.size()) s.name = k.options().arg_names[i];
    if (auto* t = std::get_if<Tensor>(&args[i])) {
      if (!t->defined())
        throw ArgumentError(fmt::format("argument {} of kernel '{}' is an undefined tensor", i,
                                        k.name()));
      s.dtype = t->dtype();
      s.shape = t->sizes();
      s.strides = t->strides();
    } else if (std::holds_alternative<double>(args[i])) {
      s.is_tensor = false;
      s.dtype = DType::f32;
    } else {
      s.is_tensor = false;
      s.dtype = DType::i64;
      s.value = std::get<int64_t>(args[i]);
    }
    specs.push_back(s);
  }
  return specs;
}

std::string specialization_key(const std::vector<ArgSpec>& args, const std::set<int>& sized) {
  std::vector<std::string> parts;
  for (size_t i = 0; i < args.size(); ++i) {
    const ArgSpec& a = args[i];
    if (!a.is_tensor) {
      parts.push_back(sized.count(int(i)) ? fmt::format("{}={}", dtype_name(a.dtype), a.value)
                                          : std::string(dtype_name(a.dtype)));
      continue;
    }
    parts.push_back(fmt::format("{}[{}]s[{}]", dtype_name(a.dtype), fmt::join(a.shape, ","),
                                fmt::join(a.strides, ",")));
  }
  return fmt::format("{}", fmt::join(parts, ";"));
}

std::set<int> sized_scalars(const ir::Kernel& ir) {
  std::set<int> out;
  for (const ir::ScalarParam& s : ir.scalars)
    if (s.specialized) out.insert(s.arg_index);
  return out;
}

ir::Kernel trace(const KernelBase& k, const std::vector<ArgSpec>& args) {
  Tracer tracer(k.name(), k.location());
  const std::vector<ArgSpec>* saved = g_args;
  g_args = &args;
  struct Restore {
    const std::vector<ArgSpec>* saved;
    ~Restore() { g_args = saved; }
  } restore{saved};
  k.trace_body();
  ir::Kernel ir = tracer.finish();
  ir.ordered_adds = ordered_adds(k, ir);
  return ir;
}

bool ordered_adds(const KernelBase& k, const ir::Kernel& ir) {
  std::string mode = k.options().atomic_add;
  if (const char* d = std::getenv("DEUTERON_DETERMINISTIC")) {
    if (std::string(d) != "0" && std::string(d) != "1")
      throw ArgumentError(fmt::format("DEUTERON_DETERMINISTIC='{}'", d), "",
                          "set it to 1 (atomic adds in a fixed order) or 0 (atomic), or unset it");
    mode = std::string(d) == "1" ? "ordered" : "atomic";
  }
  if (mode != "auto" && mode != "ordered" && mode != "atomic")
    throw ArgumentError(fmt::format("kernel '{}': unknown atomic_add option '{}'", k.name(), mode),
                        format_location(k.location()), "use \"auto\", \"ordered\" or \"atomic\"");
  if (mode != "auto") return mode == "ordered";
  // Each thread keeps a copy of every float target: cheap while those stay small.
  int64_t bytes = 0;
  std::vector<bool> counted(ir.tensors.size(), false);
  for (const ir::Op& op : ir.ops)
    if (op.atomic_add && is_floating(ir.tensors[size_t(op.tensor)].dtype) && !counted[size_t(op.tensor)]) {
      counted[size_t(op.tensor)] = true;
      bytes += ir.tensors[size_t(op.tensor)].numel() * 4;
    }
  return bytes <= (int64_t(1) << 20);
}

}  // namespace deuteron::frontend

namespace deuteron::hl::detail {

Tensor argument(int index) {
  auto& tr = frontend::Tracer::current(std::source_location::current());
  const auto& spec = frontend::g_args->at(size_t(index));
  return Tensor(spec.is_tensor ? tr.tensor_arg(spec, index) : tr.scalar_arg(spec, index));
}

void set_outputs(const std::vector<Tensor>& outs, std::source_location loc) {
  auto& tr = frontend::Tracer::current(loc);
  std::vector<std::shared_ptr<Var>> vars;
  for (const auto& o : outs) vars.push_back(o.var());
  tr.set_outputs(vars, loc);
}

}  // namespace deuteron::hl::detail
