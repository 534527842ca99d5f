// deuteron.jax.op's XLA FFI handler: a kernel called from inside a jitted JAX computation on
// the CPU without leaving it for Python. XLA hands over its buffers (row-major, contiguous);
// the kernel reads them in place and its outputs are copied into XLA's result buffers.
// Built when the building Python has jax (cmake/deuteron_python.cmake); else deuteron.jax.op
// uses jax.pure_callback.
#include <cstring>
#include <string_view>
#include <vector>

#include <fmt/format.h>
#include <nanobind/nanobind.h>

#include "deuteron/deuteron.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;
using namespace deuteron;

namespace {

bool dtype_of(ffi::DataType t, DType* out) {
  switch (t) {
    case ffi::DataType::F32: *out = DType::f32; return true;
    case ffi::DataType::BF16: *out = DType::bf16; return true;
    case ffi::DataType::F16: *out = DType::f16; return true;
    case ffi::DataType::S32: *out = DType::i32; return true;
    case ffi::DataType::S64: *out = DType::i64; return true;
    case ffi::DataType::PRED: *out = DType::boolean; return true;
    default: return false;
  }
}

// kernel: the KernelBase's address; layout: one letter per argument, T a tensor (the next
// buffer), f the next of `floats`, i the next of `ints`.
ffi::Error call(int64_t kernel, std::string_view layout, ffi::Span<const double> floats,
                ffi::Span<const int64_t> ints, ffi::RemainingArgs buffers, ffi::RemainingRets results) {
  const auto* k = reinterpret_cast<const KernelBase*>(kernel);
  try {
    std::vector<Arg> args;
    size_t next_buffer = 0, next_float = 0, next_int = 0;
    for (char c : layout) {
      if (c == 'f') {
        args.emplace_back(floats[next_float++]);
      } else if (c == 'i') {
        args.emplace_back(ints[next_int++]);
      } else {
        auto b = buffers.get<ffi::AnyBuffer>(next_buffer++);
        if (b.has_error()) return b.error();
        DType dt;
        if (!dtype_of(b->element_type(), &dt))
          return ffi::Error::InvalidArgument(fmt::format("kernel '{}': argument {} has a dtype Deuteron does not take",
                                                         k->name(), args.size()));
        auto dims = b->dimensions();
        args.emplace_back(Tensor::borrow(b->untyped_data(), std::vector<int64_t>(dims.begin(), dims.end()), dt));
      }
    }
    Outputs outs = k->run(args);
    if (outs.size() != results.size())
      return ffi::Error::Internal(fmt::format("kernel '{}' returned {} outputs, not the {} traced", k->name(),
                                              outs.size(), results.size()));
    for (size_t j = 0; j < outs.size(); ++j) {
      auto r = results.get<ffi::AnyBuffer>(j);
      if (r.has_error()) return r.error();
      if ((*r)->size_bytes() != size_t(outs[j].nbytes()))
        return ffi::Error::Internal(fmt::format("kernel '{}': output {} is {}, not the size traced", k->name(), j,
                                                outs[j].describe()));
      std::memcpy((*r)->untyped_data(), outs[j].data(), outs[j].nbytes());
    }
    return ffi::Error::Success();
  } catch (const std::exception& e) {
    return ffi::Error::Internal(e.what());
  }
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(DeuteronJaxCall, call,
                              ffi::Ffi::Bind()
                                  .Attr<int64_t>("kernel")
                                  .Attr<std::string_view>("layout")
                                  .Attr<ffi::Span<const double>>("floats")
                                  .Attr<ffi::Span<const int64_t>>("ints")
                                  .RemainingArgs()
                                  .RemainingRets());

void add_jax_ffi(nanobind::module_& m) {
  m.def("jax_ffi_handler", [] { return nanobind::capsule(reinterpret_cast<void*>(&DeuteronJaxCall)); });
}
