// _deuteron: the Python package's native module (nanobind). Kernels are called on DLPack
// tensors (PyTorch, JAX, NumPy) without copies: inputs are borrowed for the call, outputs
// are handed to the caller's framework, which keeps them alive. The Python side
// (python/deuteron/) adds the framework wrappers and the error classes.
#include <dlfcn.h>

#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/vector.h>

#include "api/api.h"
#include "autotune/autotune.h"
#include "backends/registry.h"
#include "catalogue.h"
#include "deuteron/deuteron.h"
#include "deuteron/library.h"
#include "driver/driver.h"
#include "frontend/frontend.h"

namespace nb = nanobind;
using namespace deuteron;

namespace {

// ---- tensors ---------------------------------------------------------------------------

// The frameworks an output can be returned in: the one the first tensor argument came from.
enum class Framework { numpy, pytorch, jax };

struct DTypeCode {
  DType dtype;
  nb::dlpack::dtype_code code;
  uint8_t bits;
};
constexpr DTypeCode kDTypes[] = {
    {DType::f32, nb::dlpack::dtype_code::Float, 32},  {DType::bf16, nb::dlpack::dtype_code::Bfloat, 16},
    {DType::f16, nb::dlpack::dtype_code::Float, 16},  {DType::i32, nb::dlpack::dtype_code::Int, 32},
    {DType::i64, nb::dlpack::dtype_code::Int, 64},    {DType::boolean, nb::dlpack::dtype_code::Bool, 8},
};

std::string describe(nb::dlpack::dtype t) {
  const char* kind[] = {"int", "uint", "float", "opaque", "bfloat", "complex", "bool"};
  return fmt::format("{}{}", t.code < 7 ? kind[t.code] : "code", t.bits);
}

const char* device_name(int type) {
  switch (type) {
    case nb::device::cuda::value: return "cuda";
    case nb::device::cuda_host::value: return "cuda_host";
    case nb::device::rocm::value: return "rocm";
    case nb::device::metal::value: return "metal";
    default: return "a device that is not the CPU";
  }
}

// Borrows the array's memory as a host tensor; the array outlives the call that uses it.
Tensor borrow(const nb::ndarray<nb::ro>& a, const std::string& what) {
  if (a.device_type() != nb::device::cpu::value)
    throw ArgumentError(fmt::format("{} is on {} (device {}); kernels called from Python run on the CPU and take "
                                    "host tensors",
                                    what, device_name(a.device_type()), a.device_id()),
                        "", "move it to the CPU first (torch: x.cpu(); jax: jax.device_put(x, jax.devices('cpu')[0]))");
  nb::dlpack::dtype t = a.dtype();
  const DTypeCode* found = nullptr;
  for (const DTypeCode& c : kDTypes)
    if (uint8_t(c.code) == t.code && c.bits == t.bits && t.lanes == 1) found = &c;
  if (!found)
    throw ArgumentError(fmt::format("{} has dtype {}, which Deuteron does not take", what, describe(t)), "",
                        "convert it to float32, bfloat16, float16, int32, int64 or bool");
  std::vector<int64_t> shape(a.ndim()), strides(a.ndim());
  for (size_t d = 0; d < a.ndim(); ++d) {
    shape[d] = int64_t(a.shape(d));
    strides[d] = a.stride(d);
  }
  Tensor view = Tensor::borrow(const_cast<void*>(a.data()), shape, found->dtype, strides);
  // Generated code walks positive strides; a view that steps backwards (numpy's x[::-1]) or
  // repeats elements (a stride of 0: broadcast_to, expand) is read through a contiguous copy.
  for (size_t d = 0; d < shape.size(); ++d)
    if (shape[d] > 1 && strides[d] <= 0) return view.contiguous();
  return view;
}

template <typename F>
nb::object hand_over(const Tensor& t) {
  auto* owner = new Tensor(t);
  nb::capsule keep(owner, [](void* p) noexcept { delete static_cast<Tensor*>(p); });
  std::vector<size_t> shape(t.sizes().begin(), t.sizes().end());
  nb::dlpack::dtype dt{};
  for (const DTypeCode& c : kDTypes)
    if (c.dtype == t.dtype()) dt = {uint8_t(c.code), c.bits, 1};
  nb::ndarray<F> a(t.data(), shape.size(), shape.data(), keep, t.strides().data(), dt, nb::device::cpu::value);
  return nb::cast(a, nb::rv_policy::reference);
}

// An output as an array of the framework the inputs came from (no copy).
nb::object to_python(const Tensor& t, Framework f) {
  switch (f) {
    case Framework::pytorch: {
      if (t.dtype() == DType::bf16) return hand_over<nb::pytorch>(t);  // numpy has no bfloat16
      // torch.from_dlpack takes about 8 us; a numpy array shared by torch.from_numpy, 0.6 us.
      static nb::object* from_numpy = new nb::object(nb::module_::import_("torch").attr("from_numpy"));
      return (*from_numpy)(hand_over<nb::numpy>(t));
    }
    case Framework::jax: return hand_over<nb::jax>(t);
    case Framework::numpy: break;
  }
  return hand_over<nb::numpy>(t);
}

Framework framework_of(nb::handle obj) {
  std::string module = nb::cast<std::string>(nb::getattr(obj.type(), "__module__", nb::str("")));
  if (module.rfind("torch", 0) == 0) return Framework::pytorch;
  if (module.rfind("jax", 0) == 0) return Framework::jax;
  return Framework::numpy;
}

// What the array's own __dlpack__ says when asked (a torch tensor that requires grad, a numpy
// array of a dtype DLPack has no code for).
std::string why_no_dlpack(nb::handle h) {
  try {
    h.attr("__dlpack__")();
  } catch (nb::python_error& e) {
    return nb::cast<std::string>(nb::str(e.value()));
  }
  return "its dtype, device or layout is one nanobind does not take";
}

// ---- kernels ---------------------------------------------------------------------------

struct PyKernel {
  const KernelBase* kernel = nullptr;
  const examples::Entry* entry = nullptr;  // the catalogue's, with its reference; else null

  std::string arg_label(size_t i) const {
    const auto& names = kernel->options().arg_names;
    return i < names.size() ? fmt::format("argument {} ('{}') of kernel '{}'", i, names[i], kernel->name())
                            : fmt::format("argument {} of kernel '{}'", i, kernel->name());
  }

  // Python arguments as kernel arguments; tensors are borrowed, so `args` must outlive them.
  std::vector<Arg> convert(const nb::args& args, Framework* framework) const {
    std::vector<Arg> out;
    bool seen_tensor = false;
    for (size_t i = 0; i < args.size(); ++i) {
      nb::handle h = args[i];
      if (PyBool_Check(h.ptr()))
        throw ArgumentError(fmt::format("{} is a bool; scalar arguments are int or float", arg_label(i)));
      if (PyLong_Check(h.ptr())) {
        int overflow = 0;
        long long v = PyLong_AsLongLongAndOverflow(h.ptr(), &overflow);
        if (overflow) throw ArgumentError(fmt::format("{} = {} does not fit int64", arg_label(i),
                                                      nb::cast<std::string>(nb::str(h))));
        out.emplace_back(int64_t(v));
        continue;
      }
      if (PyFloat_Check(h.ptr())) {
        out.emplace_back(PyFloat_AsDouble(h.ptr()));
        continue;
      }
      nb::ndarray<nb::ro> a;
      if (!nb::try_cast(h, a, false) && nb::hasattr(h, "__dlpack__"))
        throw ArgumentError(fmt::format("{} is a {} of dtype {} that does not hand itself over through DLPack: {}",
                                        arg_label(i), nb::cast<std::string>(nb::str(h.type())),
                                        nb::cast<std::string>(nb::str(nb::getattr(h, "dtype", nb::str("?")))),
                                        why_no_dlpack(h)));
      if (!a.is_valid())
        throw ArgumentError(fmt::format("{} is a {}; a kernel takes tensors (torch.Tensor, jax.Array, "
                                        "numpy.ndarray: anything with __dlpack__) and Python numbers",
                                        arg_label(i), nb::cast<std::string>(nb::str(h.type()))));
      out.emplace_back(borrow(a, arg_label(i)));
      if (!seen_tensor && framework) *framework = framework_of(h);
      seen_tensor = true;
    }
    return out;
  }

  nb::object results(const Outputs& outs, Framework f) const {
    if (outs.size() == 1) return to_python(outs[0], f);
    nb::list l;
    for (const Tensor& t : outs) l.append(to_python(t, f));
    return nb::tuple(l);
  }

  // "Tensor", "float" or "int" per argument: a catalogue kernel's, from its example inputs;
  // None for others (a kernel's C++ signature does not tell tensors from scalars).
  nb::object arg_kinds() const {
    if (!entry) return nb::none();
    nb::list kinds;
    for (const Arg& a : entry->inputs(entry->small_shape, entry->dtypes.front(), 1))
      kinds.append(std::holds_alternative<Tensor>(a) ? "Tensor" : std::holds_alternative<double>(a) ? "float" : "int");
    return kinds;
  }

  // y = kernel(x): the default target (the cpu), its config pinned, cached, tuned or default.
  nb::object call(const nb::args& args) const {
    Framework f = Framework::numpy;
    std::vector<Arg> a = convert(args, &f);
    Outputs outs;
    {
      nb::gil_scoped_release unlocked;
      outs = kernel->run(a);
    }
    return results(outs, f);
  }

  // The same on a named target and, optionally, a given config (JSON).
  nb::object run_on(const std::string& target, const std::string& config, const nb::args& args) const {
    Framework f = Framework::numpy;
    std::vector<Arg> a = convert(args, &f);
    api::RunResult r;
    {
      nb::gil_scoped_release unlocked;
      std::optional<config::Config> c;
      if (!config.empty()) c = config::Config::parse(config);
      r = api::run(*kernel, a, target, c);
    }
    return results(r.outputs, f);
  }

  driver::Specialized specialize(const std::vector<Arg>& a, const std::string& target) const {
    return driver::specialize(*kernel, frontend::describe_args(*kernel, a), target);
  }

  std::string emit(const std::string& target, const nb::args& args) const {
    std::vector<Arg> a = convert(args, nullptr);
    nb::gil_scoped_release unlocked;
    driver::Specialized s = specialize(a, target);
    return s.backend->emit(driver::lower(s, api::untuned_config(s).config));
  }

  // {"config": JSON text, "origin": pinned | cache | default}: what a call would use, untuned.
  nb::dict config(const std::string& target, const nb::args& args) const {
    std::vector<Arg> a = convert(args, nullptr);
    driver::Choice c;
    {
      nb::gil_scoped_release unlocked;
      c = api::untuned_config(specialize(a, target));
    }
    nb::dict d;
    d["config"] = c.config.dump();
    d["origin"] = c.origin;
    return d;
  }

  nb::dict tune(const std::string& target, const std::string& effort, double budget_s, bool retune,
                const nb::args& args) const {
    std::vector<Arg> a = convert(args, nullptr);
    autotune::TuneResult r;
    {
      nb::gil_scoped_release unlocked;
      driver::Specialized s = specialize(a, target);
      autotune::TuneOptions t;
      t.effort = effort;
      t.read_cache = !retune;
      t.args = a;
      t.time_budget_s = budget_s;
      t.progress = "quiet";
      if (entry) {
        t.reference = entry->reference;
        t.tolerance = [e = entry](DType d) { return examples::tolerance_for(*e, d); };
      }
      r = autotune::tune(s, t);
    }
    nb::dict d;
    d["config"] = r.best.dump();
    d["default"] = r.default_config.dump();
    d["seconds"] = r.best_s;
    d["default_seconds"] = r.default_s;
    d["from_cache"] = r.from_cache;
    d["effort"] = r.effort;
    d["tried"] = r.tried;
    d["elapsed_s"] = r.elapsed_s;
    d["cache"] = r.cache_path;
    return d;
  }

  // What a call would return, from shapes and dtypes alone (for torch's fake tensors and
  // jax's abstract values): [(shape, dtype name)] per output. `specs` holds, per argument,
  // (shape, strides, dtype name) for a tensor or an int / float for a scalar.
  std::vector<std::pair<std::vector<int64_t>, std::string>> output_specs(const nb::list& specs) const {
    if (int(specs.size()) != kernel->arity())
      throw ArgumentError(fmt::format("kernel '{}' takes {} arguments, got {}", kernel->name(), kernel->arity(),
                                      specs.size()),
                          format_location(kernel->location()));
    std::vector<frontend::ArgSpec> a;
    for (size_t i = 0; i < specs.size(); ++i) {
      frontend::ArgSpec s;
      if (i < kernel->options().arg_names.size()) s.name = kernel->options().arg_names[i];
      nb::handle h = specs[i];
      if (nb::isinstance<nb::tuple>(h)) {
        s.shape = nb::cast<std::vector<int64_t>>(h[0]);
        s.strides = nb::cast<std::vector<int64_t>>(h[1]);
        s.dtype = parse_dtype(nb::cast<std::string>(h[2]));
      } else {
        s.is_tensor = false;
        s.dtype = PyFloat_Check(h.ptr()) ? DType::f32 : DType::i64;
      }
      a.push_back(s);
    }
    ir::Kernel k;
    {
      nb::gil_scoped_release unlocked;
      k = frontend::trace(*kernel, a);
    }
    std::vector<std::pair<std::vector<int64_t>, std::string>> out;
    for (int o : k.outputs) {
      const ir::HostTensor& t = k.tensors[size_t(o)];
      out.emplace_back(t.shape, std::string(dtype_name(t.dtype)));
    }
    return out;
  }
};

// ---- errors ----------------------------------------------------------------------------

// The Python classes (deuteron/errors.py) by the C++ class's name, set when the package loads.
nb::dict& error_classes() {
  static nb::dict* classes = new nb::dict();  // never destroyed: Python may be gone by then
  return *classes;
}

void raise_as(const char* name, const Error& e) {
  nb::object cls = error_classes().contains(name) ? nb::object(error_classes()[name]) : nb::object();
  if (!cls.is_valid()) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
    return;
  }
  nb::object err = cls(nb::str(e.message().c_str()), nb::str(e.where().c_str()), nb::str(e.hint().c_str()));
  PyErr_SetObject(cls.ptr(), err.ptr());
}

void translate(const std::exception_ptr& p, void*) {
  try {
    std::rethrow_exception(p);
  } catch (const KernelError& e) {
    raise_as("KernelError", e);
  } catch (const ArgumentError& e) {
    raise_as("ArgumentError", e);
  } catch (const ConfigError& e) {
    raise_as("ConfigError", e);
  } catch (const CompileError& e) {
    raise_as("CompileError", e);
  } catch (const deuteron::RuntimeError& e) {
    raise_as("RuntimeError", e);
  } catch (const Error& e) {
    raise_as("Error", e);
  }
}

// ---- libraries -------------------------------------------------------------------------

// This module's own symbols, made visible to libraries opened after it: their calls into
// Deuteron bind to the copy linked in here (deuteron/library.h).
void export_own_symbols() {
  static bool done = false;
  if (done) return;
  Dl_info info;
  if (!dladdr(reinterpret_cast<void*>(&export_own_symbols), &info) ||
      !dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD | RTLD_GLOBAL))
    throw deuteron::RuntimeError("cannot make the deuteron module's symbols global for kernel libraries");
  done = true;
}

std::vector<PyKernel> load(const std::string& path) {
  export_own_symbols();
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle)
    throw deuteron::RuntimeError(fmt::format("cannot open the kernel library {}: {}", path, dlerror()), "",
                                 "build it with find_package(deuteron) and link deuteron::headers (README)");
  using Entry = const KernelLibrary* (*)();
  auto fn = reinterpret_cast<Entry>(dlsym(handle, "deuteron_kernel_library"));
  if (!fn)
    throw deuteron::RuntimeError(fmt::format("{} lists no kernels: it has no deuteron_kernel_library()", path), "",
                                 "add DEUTERON_KERNEL_LIBRARY(kernel, ...) to one of its sources "
                                 "(#include <deuteron/library.h>)");
  const KernelLibrary* lib = fn();
  if (lib->abi != DEUTERON_LIBRARY_ABI)
    throw deuteron::RuntimeError(fmt::format("{} was built for kernel library ABI {}, this package reads {}", path,
                                             lib->abi, DEUTERON_LIBRARY_ABI),
                                 "", "rebuild it against this version's headers");
  // The library stays open: its kernels' code lives there.
  std::vector<PyKernel> out;
  for (const KernelBase* k : lib->kernels) out.push_back(PyKernel{k, nullptr});
  return out;
}

}  // namespace

#ifdef DEUTERON_JAX_FFI
void add_jax_ffi(nb::module_& m);  // jax_ffi.cpp
#endif

NB_MODULE(_deuteron, m) {
  m.doc() = "Deuteron's native module; use the deuteron package";
  nb::register_exception_translator(translate);
  // Kernels held at exit by registries outside Python's teardown order (torch.library's ops,
  // jax's jit caches) are still alive when nanobind counts: not leaks, so no warning.
  nb::set_leak_warnings(false);

  nb::class_<PyKernel>(m, "Kernel")
      .def_prop_ro("name", [](const PyKernel& k) { return k.kernel->name(); })
      .def_prop_ro("arity", [](const PyKernel& k) { return k.kernel->arity(); })
      .def_prop_ro("arg_names", [](const PyKernel& k) { return k.kernel->options().arg_names; })
      .def_prop_ro("defined_at", [](const PyKernel& k) { return format_location(k.kernel->location()); })
      .def_prop_ro("summary", [](const PyKernel& k) { return k.entry ? k.entry->summary : std::string(); })
      .def_prop_ro("arg_kinds", &PyKernel::arg_kinds)
      .def_prop_ro("address", [](const PyKernel& k) { return reinterpret_cast<uintptr_t>(k.kernel); })
      .def("__call__", &PyKernel::call)
      .def("run_on", &PyKernel::run_on)
      .def("emit", &PyKernel::emit)
      .def("config", &PyKernel::config)
      .def("tune", &PyKernel::tune)
      .def("output_specs", &PyKernel::output_specs);

  m.def("catalogue", [] {
    std::vector<PyKernel> out;
    for (const examples::Entry& e : examples::catalogue()) out.push_back(PyKernel{e.kernel, &e});
    return out;
  });
  m.def("load", &load);
  m.def("targets", [] { return backends::names(); });
  m.def("_set_error_classes", [](nb::dict d) { error_classes() = d; });
#ifdef DEUTERON_JAX_FFI
  add_jax_ffi(m);
#endif
}
