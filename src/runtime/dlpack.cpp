// DLPack import and export for host tensors (CPU device only).
#include <dlpack/dlpack.h>

#include "deuteron/error.h"
#include "deuteron/tensor.h"

namespace deuteron {

namespace {

// kDLBool arrived in DLPack 0.8; the installed header (0.6) does not name it yet.
constexpr uint8_t kDLBoolCode = 6;

std::string dl_type_string(const DLDataType& t) {
  return "code=" + std::to_string(t.code) + " bits=" + std::to_string(t.bits) +
         " lanes=" + std::to_string(t.lanes);
}

DType dtype_from_dl(const DLDataType& t) {
  if (t.lanes == 1) {
    if (t.code == kDLFloat && t.bits == 32) return DType::f32;
    if (t.code == kDLFloat && t.bits == 16) return DType::f16;
    if (t.code == kDLBfloat && t.bits == 16) return DType::bf16;
    if (t.code == kDLInt && t.bits == 32) return DType::i32;
    if (t.code == kDLInt && t.bits == 64) return DType::i64;
    // Older producers (PyTorch before kDLBool existed) send bool as uint8.
    if ((t.code == kDLBoolCode || t.code == kDLUInt) && t.bits == 8) return DType::boolean;
  }
  throw ArgumentError("unsupported DLPack dtype (" + dl_type_string(t) + ")", "",
                      "supported: float32, float16, bfloat16, int32, int64, bool");
}

DLDataType dl_from_dtype(DType t) {
  switch (t) {
    case DType::f32: return {kDLFloat, 32, 1};
    case DType::bf16: return {kDLBfloat, 16, 1};
    case DType::f16: return {kDLFloat, 16, 1};
    case DType::i32: return {kDLInt, 32, 1};
    case DType::i64: return {kDLInt, 64, 1};
    case DType::boolean: return {kDLBoolCode, 8, 1};
  }
  throw RuntimeError("invalid DType value " + std::to_string(int(t)));
}

// What an exported DLManagedTensor points back to: the tensor (keeping its buffer alive)
// and the shape/stride arrays the DLTensor refers to.
struct ExportContext {
  Tensor tensor;
  std::vector<int64_t> shape, strides;
};

void delete_exported(DLManagedTensor* self) {
  delete static_cast<ExportContext*>(self->manager_ctx);
  delete self;
}

// Calls the producer's deleter exactly once, whether the import succeeds or fails.
void release(DLManagedTensor* m) {
  if (m && m->deleter) m->deleter(m);
}

}  // namespace

Tensor Tensor::from_dlpack(DLManagedTensor* managed) {
  if (!managed) throw ArgumentError("from_dlpack: null DLManagedTensor");
  // Take ownership first, so that every error path below still frees the producer's tensor.
  std::shared_ptr<void> owner(managed, [](void* p) { release(static_cast<DLManagedTensor*>(p)); });
  const DLTensor& dl = managed->dl_tensor;
  if (dl.device.device_type != kDLCPU)
    throw ArgumentError("from_dlpack: tensor is on device type " +
                            std::to_string(int(dl.device.device_type)) + ", not the CPU",
                        "", "copy it to host memory before passing it to Deuteron");
  const DType dtype = dtype_from_dl(dl.dtype);
  if (dl.ndim < 0) throw ArgumentError("from_dlpack: negative ndim");
  if (dl.ndim > 0 && !dl.shape) throw ArgumentError("from_dlpack: null shape");
  std::vector<int64_t> shape(dl.shape, dl.shape + dl.ndim);
  std::vector<int64_t> strides;  // empty (NULL in DLPack) means compact row-major
  if (dl.strides) strides.assign(dl.strides, dl.strides + dl.ndim);
  void* data = dl.data ? static_cast<char*>(dl.data) + dl.byte_offset : nullptr;
  Tensor t = borrow(data, std::move(shape), dtype, std::move(strides));
  t.owner_ = std::move(owner);
  return t;
}

DLManagedTensor* Tensor::to_dlpack() const {
  if (!defined()) throw ArgumentError("to_dlpack: undefined tensor");
  // The context holds a copy of this Tensor: the consumer shares ownership of the buffer.
  // A borrowed tensor has no owner, so its memory must outlive the consumer.
  auto ctx = std::make_unique<ExportContext>(ExportContext{*this, shape_, strides_});
  auto managed = std::make_unique<DLManagedTensor>();
  DLTensor& dl = managed->dl_tensor;
  dl.data = data_;
  dl.device = {kDLCPU, 0};
  dl.ndim = dim();
  dl.dtype = dl_from_dtype(dtype_);
  dl.shape = ctx->shape.data();
  dl.strides = ctx->strides.data();
  dl.byte_offset = 0;
  managed->manager_ctx = ctx.release();
  managed->deleter = delete_exported;
  return managed.release();
}

}  // namespace deuteron
