// Writes an ahead-of-time build (aot.h): for the cpu target a C header, the dispatch between
// variants (C++), the variants' sources and a CMakeLists.txt; for Python targets the modules
// and a dispatch table. The dispatch code is tables of what each kernel takes plus one fixed
// prelude that reads them, so what differs between kernels stays data.
#include <fstream>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "aot.h"
#include "deuteron/error.h"
#include "runtime/text.h"

namespace deuteron::cli::aot {

namespace {

namespace fs = std::filesystem;

void put(const fs::path& path, const std::string& text) {
  std::error_code ec;
  fs::create_directories(path.parent_path(), ec);
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << text;
  f.close();
  if (!f) throw ArgumentError(fmt::format("cannot write '{}'", runtime::escaped(path.string())), "",
                              "pass --out a folder you can write, with space left");
}

std::string dim_text(const Kernel& k, const Size& s) {
  return s.param >= 0 ? k.shape_names[size_t(s.param)] : std::to_string(s.fixed);
}

// "x[M, N]"
std::string signature_of(const Kernel& k, const TensorArg& t) {
  std::vector<std::string> d;
  for (const Size& s : t.dims) d.push_back(dim_text(k, s));
  return fmt::format("{}[{}]", t.name, fmt::join(d, ", "));
}

std::string shapes_text(const std::vector<Variant>& vs) {
  std::vector<std::string> out;
  for (const Variant& v : vs) out.push_back(fmt::format("{}", fmt::join(v.shape, "x")));
  return fmt::format("{}", fmt::join(out, ", "));
}

std::string describe(const Kernel& k) {
  std::vector<std::string> in, out;
  for (const TensorArg& t : k.tensors) (t.output ? out : in).push_back(signature_of(k, t));
  for (const std::string& s : k.scalars) in.push_back(s);
  return fmt::format("{} -> {}", fmt::join(in, ", "), fmt::join(out, ", "));
}

// The scalar parameters of a kernel's entry points: integers as int64_t (exact), floats as double.
std::vector<std::string> scalar_params(const Kernel& k) {
  std::vector<std::string> p;
  for (size_t i = 0; i < k.scalars.size(); ++i) p.push_back((k.scalar_integer[i] ? "int64_t " : "double ") + k.scalars[i]);
  return p;
}

std::string params_of(const Kernel& k) {
  std::vector<std::string> p;
  for (const TensorArg& t : k.tensors)
    p.push_back(fmt::format("{}{}* {}", t.output ? "" : "const ", storage_ctype(t.dtype), t.name));
  for (const std::string& s : scalar_params(k)) p.push_back(s);
  for (const std::string& n : k.shape_names) p.push_back("int64_t " + runtime::identifier(n));
  return fmt::format("{}", fmt::join(p, ", "));
}

// Text for a /* */ comment: one line that cannot end it.
std::string comment(const std::string& s) {
  std::string out = runtime::escaped(s);
  for (size_t at = out.find("*/"); at != std::string::npos; at = out.find("*/", at)) out.replace(at, 2, "* /");
  return out;
}

std::string header(const Build& b) {
  std::string n = b.name, N = n;
  for (char& c : N) c = char(std::toupper(static_cast<unsigned char>(c)));
  std::string h = fmt::format(R"TXT(// {0}: kernels built ahead of time by Deuteron for the cpu target.
//   {1}
// Plain C; nothing else of Deuteron is needed to build or run them (CMakeLists.txt builds the
// library). Tensors are contiguous, row-major, {2} (bfloat16 and float16 as their 16-bit
// patterns, uint16_t), in memory the caller owns; outputs are written in place. Every entry
// point returns {3}_OK or an error code, and {0}_last_error() says what went wrong (for the
// calling thread). A shape built ahead of time runs its tuned variant; any other runs the
// general variant of the tuned shape nearest it (log-size distance), which reads its sizes at
// run time.
#pragma once

#include <stdint.h>

#ifdef __cplusplus
extern "C" {{
#endif

enum {{
  {3}_OK = 0,
  {3}_BAD_ARGUMENT = 1,        /* a null pointer, a size below 1, a wrong rank, dtype or dim */
  {3}_INDEX_OUT_OF_RANGE = 2,  /* an index the kernel computed is outside its dim (outputs incomplete) */
  {3}_NO_VARIANT = 3,          /* a shape not built, and the kernel has no general variant */
  {3}_OUT_OF_MEMORY = 4        /* its scratch could not be allocated */
}};

enum {{ {3}_FLOAT32 = 0, {3}_BFLOAT16 = 1, {3}_FLOAT16 = 2, {3}_INT32 = 3, {3}_INT64 = 4, {3}_BOOL = 5 }};

/* A view of a caller's tensor: contiguous, row-major. */
typedef struct {{
  void* data;
  int32_t dtype; /* {3}_FLOAT32, ... */
  int32_t rank;
  const int64_t* shape;
}} {0}_tensor;

/* What the last failed call on this thread said (empty after a successful one). */
const char* {0}_last_error(void);
)TXT",
                              n, b.command, dtype_name(b.dtype), N);
  for (const Kernel& k : b.kernels) {
    std::vector<std::string> views;
    for (const TensorArg& t : k.tensors) views.push_back(fmt::format("{}const {}_tensor* {}", t.output ? "" : "", n, t.name));
    for (const std::string& s : scalar_params(k)) views.push_back(s);
    std::string names = fmt::format("{}", fmt::join(k.shape_names, ", "));
    h += fmt::format(R"TXT(
/* {0}: {1}
 * Tuned for {2} = {3}; {4}. */
int {5}_{6}({7});
/* The same on tensor views: checks each one's dtype, rank and dims against the others. */
int {5}_{6}_tensors({8});
/* The variant a call at these sizes runs (its function's name), or NULL. */
const char* {5}_{6}_variant({9});
)TXT",
                     k.name, describe(k), names, shapes_text(k.tuned),
                     k.general.empty() ? "other shapes fail with _NO_VARIANT (" + comment(k.no_general) + ")"
                                       : "other shapes run a general variant",
                     n, k.ident, params_of(k), fmt::join(views, ", "),
                     fmt::format("{}", fmt::join([&] {
                       std::vector<std::string> p;
                       for (const std::string& s : k.shape_names) p.push_back("int64_t " + runtime::identifier(s));
                       return p;
                     }(), ", ")));
  }
  h += R"TXT(
#ifdef __cplusplus
}
#endif
)TXT";
  return h;
}

// The fixed half of the dispatch: what every kernel's tables go through.
std::string prelude(const Build& b) {
  std::string N = b.name;
  for (char& c : N) c = char(std::toupper(static_cast<unsigned char>(c)));
  return fmt::format(R"TXT(// {0}: the entry points of {0}.h, dispatching by shape between the variants.
//   {1}
#include "{0}.h"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace {{

// One scalar argument: the generated code's dt::Scalar.
union Scalar {{
  double real;
  int64_t integer;
}};
using KernelFn = void(void* const*, const Scalar*, char*, long, int64_t*);
using GeneralFn = void(void* const*, const Scalar*, char*, long, int64_t*, const int64_t*);

// A size of the kernel: shape parameter `param`, or `fixed` when param < 0.
struct Size {{
  int param;
  int64_t fixed;
}};
struct TensorSpec {{
  const char* name;
  int dtype;
  int rank;
  const Size* dims;
}};
struct Variant {{
  const char* name;
  const int64_t* shape;  // tuned: the shape it was made for
  KernelFn* tuned;       // or
  GeneralFn* general;    // reads its sizes at run time
  long scratch_per_thread;
  int threads;
  int general_index;  // tuned: the general variant for shapes nearest this one (-1: none)
  // General: scratch_per_thread at a call's sizes (then scratch_per_thread is 0), or nullptr.
  long (*scratch_for)(const int64_t* sizes);
}};
struct IndexCheck {{
  int tensor, dim;
  const char* where;
}};
struct KernelSpec {{
  const char* name;
  int rank;  // shape parameters
  const char* const* params;
  int tensors;
  const TensorSpec* tensor;
  int axes;
  const Size* axis;
  const Variant* tuned;
  int tuned_count;
  const Variant* general;  // nullptr: none (why_no_general)
  const char* why_no_general;
  const IndexCheck* checks;  // what status word 1 + i of a variant means
  int check_count;
}};

thread_local std::string last_error;

int fail(int code, std::string message) {{
  last_error = std::move(message);
  return code;
}}

int64_t size_at(const Size& s, const int64_t* shape) {{ return s.param >= 0 ? shape[s.param] : s.fixed; }}

std::string shape_text(const int64_t* shape, int rank) {{
  std::string s;
  for (int i = 0; i < rank; ++i) s += (i ? "x" : "") + std::to_string(shape[i]);
  return s;
}}

// Each size at least 1 and each tensor's bytes countable.
int check_sizes(const KernelSpec& k, const int64_t* shape) {{
  for (int i = 0; i < k.rank; ++i)
    if (shape[i] < 1)
      return fail({2}_BAD_ARGUMENT, std::string(k.name) + ": " + k.params[i] + " = " + std::to_string(shape[i]) +
                                        ": sizes must be at least 1");
  for (int t = 0; t < k.tensors; ++t) {{
    int64_t n = 8;
    for (int d = 0; d < k.tensor[t].rank; ++d)
      if (__builtin_mul_overflow(n, size_at(k.tensor[t].dims[d], shape), &n))
        return fail({2}_BAD_ARGUMENT, std::string(k.name) + ": " + k.tensor[t].name + " at " + shape_text(shape, k.rank) +
                                          " has more elements than memory can hold");
  }}
  return {2}_OK;
}}

// The tuned variant of `shape`, else the general variant of the tuned shape nearest it in
// log-size distance (sum over sizes of ln(a/b)^2: configs follow the sizes' orders of
// magnitude), else nullptr.
const Variant* pick(const KernelSpec& k, const int64_t* shape) {{
  const Variant* nearest = nullptr;
  double best = INFINITY;
  for (int v = 0; v < k.tuned_count; ++v) {{
    const Variant& t = k.tuned[v];
    double d = 0;
    for (int i = 0; i < k.rank; ++i) d += std::pow(std::log(double(shape[i]) / double(t.shape[i])), 2);
    if (d == 0) return &t;
    if (d < best) best = d, nearest = &t;
  }}
  if (!k.general || !nearest || nearest->general_index < 0) return nullptr;
  return &k.general[nearest->general_index];
}}

// Scratch for this thread's calls, kept between them.
char* scratch(size_t bytes) {{
  struct Buffer {{
    char* data = nullptr;
    size_t size = 0;
    ~Buffer() {{ std::free(data); }}
  }};
  thread_local Buffer b;
  if (bytes > b.size) {{
    std::free(b.data);
    b.size = (bytes + 63) / 64 * 64;
    b.data = static_cast<char*>(std::aligned_alloc(64, b.size));
    if (!b.data) b.size = 0;
  }}
  return b.data;
}}

int launch(const KernelSpec& k, const int64_t* shape, void* const* tensors, const Scalar* scalars) {{
  if (int rc = check_sizes(k, shape)) return rc;
  for (int t = 0; t < k.tensors; ++t)
    if (!tensors[t]) return fail({2}_BAD_ARGUMENT, std::string(k.name) + ": " + k.tensor[t].name + " is a null pointer");
  const Variant* v = pick(k, shape);
  if (!v)
    return fail({2}_NO_VARIANT, std::string(k.name) + ": no variant for " + shape_text(shape, k.rank) +
                                    ": it was built only for its tuned shapes and has no general variant (" +
                                    k.why_no_general + "); build this shape with deuteron aot");
  // A general variant's sizes: every axis' extent, then each tensor's dims, then its strides
  // (contiguous).
  int64_t sizes[256];
  if (v->general) {{
    int at = 0;
    for (int a = 0; a < k.axes; ++a) sizes[at++] = size_at(k.axis[a], shape);
    for (int t = 0; t < k.tensors; ++t)
      for (int d = 0; d < k.tensor[t].rank; ++d) sizes[at++] = size_at(k.tensor[t].dims[d], shape);
    for (int t = 0; t < k.tensors; ++t) {{
      int64_t stride = 1;
      at += k.tensor[t].rank;
      for (int d = k.tensor[t].rank; d-- > 0;) {{
        sizes[at - k.tensor[t].rank + d] = stride;
        stride *= size_at(k.tensor[t].dims[d], shape);
      }}
    }}
  }}
  long per_thread = v->scratch_for ? v->scratch_for(sizes) : v->scratch_per_thread;
  char* fast = scratch(size_t(per_thread) * size_t(v->threads) + 64);
  if (!fast) return fail({2}_OUT_OF_MEMORY, std::string(k.name) + ": cannot allocate its scratch");
  int64_t status[2] = {{0, 0}};
  if (v->tuned) v->tuned(tensors, scalars, fast, per_thread, status);
  else v->general(tensors, scalars, fast, per_thread, status, sizes);
  if (status[0] > 0) {{
    std::string what = "an index the kernel computed";
    if (status[0] <= k.check_count) {{
      const IndexCheck& c = k.checks[status[0] - 1];
      what = "dim " + std::to_string(c.dim) + " of " + k.tensor[c.tensor].name + " (size " +
             std::to_string(size_at(k.tensor[c.tensor].dims[c.dim], shape)) + "), indexed at " + c.where;
    }}
    return fail({2}_INDEX_OUT_OF_RANGE, std::string(k.name) + ": index " + std::to_string(status[1]) +
                                            " is out of range for " + what + "; the outputs are incomplete");
  }}
  last_error.clear();
  return {2}_OK;
}}

// Tensor views: each one's dtype and rank, and its dims against the shape parameters the
// first views give.
int from_views(const KernelSpec& k, const {3}_tensor* const* views, int64_t* shape, void** data) {{
  for (int i = 0; i < k.rank; ++i) shape[i] = -1;
  for (int t = 0; t < k.tensors; ++t) {{
    const TensorSpec& s = k.tensor[t];
    const {3}_tensor* v = views[t];
    std::string what = std::string(k.name) + ": " + s.name;
    if (!v) return fail({2}_BAD_ARGUMENT, what + " is a null pointer");
    if (v->dtype != s.dtype)
      return fail({2}_BAD_ARGUMENT, what + " has dtype code " + std::to_string(v->dtype) + "; it takes code " +
                                        std::to_string(s.dtype) + " (see the enum in {3}.h)");
    if (v->rank != s.rank || (v->rank > 0 && !v->shape))
      return fail({2}_BAD_ARGUMENT, what + " has rank " + std::to_string(v->rank) + "; it takes rank " + std::to_string(s.rank));
    for (int d = 0; d < s.rank; ++d) {{
      int64_t want = s.dims[d].param >= 0 ? shape[s.dims[d].param] : s.dims[d].fixed;
      if (want < 0) {{
        shape[s.dims[d].param] = v->shape[d];
      }} else if (v->shape[d] != want) {{
        return fail({2}_BAD_ARGUMENT, what + ": dim " + std::to_string(d) + " is " + std::to_string(v->shape[d]) +
                                          ", but it must be " + std::to_string(want) +
                                          (s.dims[d].param >= 0 ? std::string(" (") + k.params[s.dims[d].param] +
                                                                      ", from the tensors before it)" : ""));
      }}
    }}
    data[t] = v->data;
  }}
  return {2}_OK;
}}

}}  // namespace

extern "C" const char* {0}_last_error(void) {{ return last_error.c_str(); }}
)TXT",
                     b.name, b.command, N, b.name);
}

std::string c_string(const std::string& s) { return "\"" + runtime::escaped(s) + "\""; }

std::string sizes_table(const std::vector<Size>& sizes) {
  std::vector<std::string> out;
  for (const Size& s : sizes) out.push_back(fmt::format("{{{}, {}}}", s.param, s.fixed));
  return out.empty() ? "{-1, 0}" : fmt::format("{}", fmt::join(out, ", "));
}

int dtype_code(DType t) {
  switch (t) {
    case DType::f32: return 0;
    case DType::bf16: return 1;
    case DType::f16: return 2;
    case DType::i32: return 3;
    case DType::i64: return 4;
    case DType::boolean: return 5;
  }
  return 0;
}

std::string kernel_dispatch(const Build& b, const Kernel& k) {
  const std::string& n = b.name;
  size_t sizes = k.axes.size();
  for (const TensorArg& t : k.tensors) sizes += 2 * t.dims.size();
  if (!k.general.empty() && sizes > 256)  // the prelude's `sizes` array
    throw ArgumentError(fmt::format("kernel '{}' has {} sizes for its general variant, more than 256", k.name, sizes));
  std::string K = k.ident;
  std::string s = fmt::format("\n// ---- {}: {} ----\n", k.name, describe(k));
  for (const Variant& v : k.tuned)
    s += fmt::format("extern \"C\" void {}(void* const*, const Scalar*, char*, long, int64_t*);\n", v.code.entry);
  for (const Variant& v : k.general) {
    s += fmt::format("extern \"C\" void {}(void* const*, const Scalar*, char*, long, int64_t*, const int64_t*);\n",
                     v.code.entry);
    if (!v.code.scratch_function.empty())
      s += fmt::format("extern \"C\" long {}(const int64_t*);\n", v.code.scratch_function);
  }
  s += "\nnamespace {\n\n";
  std::vector<std::string> params, tensors;
  for (const std::string& p : k.shape_names) params.push_back(c_string(p));
  s += fmt::format("const char* const {}_params[] = {{{}}};\n", K, fmt::join(params, ", "));
  for (const TensorArg& t : k.tensors) {
    s += fmt::format("const Size {}_{}_dims[] = {{{}}};\n", K, t.name, sizes_table(t.dims));
    tensors.push_back(fmt::format("{{{}, {}, {}, {}_{}_dims}}", c_string(t.name), dtype_code(t.dtype), t.dims.size(), K, t.name));
  }
  s += fmt::format("const TensorSpec {}_tensors[] = {{{}}};\n", K, fmt::join(tensors, ", "));
  s += fmt::format("const Size {}_axes[] = {{{}}};\n", K, sizes_table(k.axes));
  std::vector<std::string> tuned, general;
  for (size_t i = 0; i < k.tuned.size(); ++i) {
    const Variant& v = k.tuned[i];
    s += fmt::format("const int64_t {}_shape{}[] = {{{}}};\n", K, i, fmt::join(v.shape, ", "));
    tuned.push_back(fmt::format("  {{{}, {}_shape{}, {}, nullptr, {}, {}, {}, nullptr}},  // config {}",
                                c_string(v.code.entry), K, i, v.code.entry, v.code.scratch_per_thread, v.code.threads,
                                v.general, v.config));
  }
  for (const Variant& v : k.general)
    general.push_back(fmt::format("  {{{}, nullptr, nullptr, {}, {}, {}, -1, {}}},  // config {}", c_string(v.code.entry),
                                  v.code.entry, v.code.scratch_per_thread, v.code.threads,
                                  v.code.scratch_function.empty() ? "nullptr" : v.code.scratch_function, v.config));
  s += fmt::format("const Variant {}_tuned[] = {{\n{}\n}};\n", K, fmt::join(tuned, "\n"));
  if (!general.empty()) s += fmt::format("const Variant {}_general[] = {{\n{}\n}};\n", K, fmt::join(general, "\n"));
  std::vector<std::string> checks;
  // The same checks in every variant: they come from the kernel's indexing, not its shape.
  for (const backends::AotIndexCheck& c : k.tuned.front().code.index_checks)
    checks.push_back(fmt::format("{{{}, {}, {}}}", c.tensor, c.dim, c_string(c.where)));
  s += fmt::format("const IndexCheck {}_checks[] = {{{}}};\n", K, checks.empty() ? "{-1, -1, nullptr}" : fmt::format("{}", fmt::join(checks, ", ")));
  s += fmt::format(
      "const KernelSpec {0}_spec = {{{1}, {2}, {0}_params, {3}, {0}_tensors, {4}, {0}_axes, {0}_tuned, {5}, {6}, {7}, "
      "{0}_checks, {8}}};\n\n}}  // namespace\n",
      K, c_string(k.name), k.shape_names.size(), k.tensors.size(), k.axes.size(), k.tuned.size(),
      general.empty() ? "nullptr" : K + "_general", c_string(k.no_general), checks.size());

  // The three entry points.
  std::vector<std::string> shape_args, ptrs, view_params, scalar_args;
  for (const std::string& p : k.shape_names) shape_args.push_back(runtime::identifier(p));
  for (const TensorArg& t : k.tensors) {
    ptrs.push_back(t.output ? t.name : fmt::format("const_cast<{}*>({})", storage_ctype(t.dtype), t.name));
    view_params.push_back(fmt::format("const {}_tensor* {}", n, t.name));
  }
  for (size_t i = 0; i < k.scalars.size(); ++i) {
    view_params.push_back(scalar_params(k)[i]);
    scalar_args.push_back(fmt::format("{{.{} = {}}}", k.scalar_integer[i] ? "integer" : "real", k.scalars[i]));
  }
  std::string scalars = scalar_args.empty() ? "const Scalar* scalars = nullptr;"
                                            : fmt::format("const Scalar scalars[] = {{{}}};", fmt::join(scalar_args, ", "));
  std::vector<std::string> shape_params;
  for (const std::string& p : shape_args) shape_params.push_back("int64_t " + p);
  std::vector<std::string> view_names;
  for (const TensorArg& t : k.tensors) view_names.push_back(t.name);
  s += fmt::format(R"TXT(
extern "C" int {0}_{1}({2}) {{
  const int64_t shape[] = {{{3}}};
  void* const tensors[] = {{{4}}};
  {5}
  return launch({1}_spec, shape, tensors, scalars);
}}

extern "C" int {0}_{1}_tensors({6}) {{
  const {0}_tensor* const views[] = {{{7}}};
  int64_t shape[{8}];
  void* tensors[{9}];
  if (int rc = from_views({1}_spec, views, shape, tensors)) return rc;
  {5}
  return launch({1}_spec, shape, tensors, scalars);
}}

extern "C" const char* {0}_{1}_variant({10}) {{
  const int64_t shape[] = {{{3}}};
  const Variant* v = pick({1}_spec, shape);
  return v ? v->name : nullptr;
}}
)TXT",
                   n, K, params_of(k), fmt::join(shape_args, ", "), fmt::join(ptrs, ", "), scalars,
                   fmt::join(view_params, ", "), fmt::join(view_names, ", "), k.shape_names.size(), k.tensors.size(),
                   fmt::join(shape_params, ", "));
  return s;
}

std::string cmake_file(const Build& b, const std::vector<std::string>& sources) {
  std::string N = b.name;
  for (char& c : N) c = char(std::toupper(static_cast<unsigned char>(c)));
  return fmt::format(R"TXT(# {0}: kernels built ahead of time by Deuteron.
#   {1}
# Builds them into a library that needs no Deuteron, no compiler at run time, no tuner and no
# cache: the generated code uses OpenMP (its grid runs on threads) and the C++ standard library
# with libm. Use it with add_subdirectory(this folder) and target_link_libraries(app {0}), or
# build it alone (cmake -S . -B build) for lib{0}.a / .so.
cmake_minimum_required(VERSION 3.16)
project({0} LANGUAGES CXX)

option({2}_SHARED "build a shared library instead of a static one" OFF)
# The tuner timed the variants on code built for its own CPU (-march=native); off, they build
# for any CPU of this architecture, and may run slower.
option({2}_NATIVE "compile for the CPU building it (-march=native), as the tuner did" ON)

find_package(OpenMP REQUIRED)

if({2}_SHARED)
  add_library({0} SHARED)
else()
  add_library({0} STATIC)
endif()
target_sources({0} PRIVATE
  {3})
target_compile_features({0} PRIVATE cxx_std_20)
set_target_properties({0} PROPERTIES POSITION_INDEPENDENT_CODE ON)
# The flags the variants were tuned with (no -ffast-math: they must match their references).
target_compile_options({0} PRIVATE -O3 -fno-math-errno -ffp-contract=fast $<$<BOOL:${{{2}_NATIVE}}>:-march=native>
  $<$<CXX_COMPILER_ID:GNU>:-fno-tree-loop-distribute-patterns>)
target_include_directories({0} PUBLIC ${{CMAKE_CURRENT_SOURCE_DIR}}/include PRIVATE ${{CMAKE_CURRENT_SOURCE_DIR}}/src)
target_link_libraries({0} PUBLIC OpenMP::OpenMP_CXX m)
)TXT",
                     b.name, b.command, N, fmt::join(sources, "\n  "));
}

void write_cpp(const Build& b, const fs::path& out) {
  std::vector<std::string> sources = {fmt::format("src/{}_dispatch.cpp", b.name)};
  std::string dispatch = prelude(b);
  nlohmann::json manifest = {{"name", b.name}, {"target", b.target}, {"dtype", dtype_name(b.dtype)},
                             {"command", b.command}, {"kernels", nlohmann::json::array()}};
  for (const Kernel& k : b.kernels) {
    dispatch += kernel_dispatch(b, k);
    nlohmann::json jk = {{"kernel", k.name}, {"tuned", nlohmann::json::array()}, {"general", nlohmann::json::array()},
                         {"no_general", k.no_general}};
    for (const Variant& v : k.tuned) {
      sources.push_back("src/" + v.file);
      put(out / "src" / v.file, fmt::format("// {} [{}]: tuned variant, built by `{}`\n{}", k.name, fmt::join(v.shape, ", "),
                                            b.command, v.code.source));
      jk["tuned"].push_back({{"shape", v.shape}, {"entry", v.code.entry}, {"config", nlohmann::json::parse(v.config)},
                             {"general", v.general}});
    }
    for (const Variant& v : k.general) {
      sources.push_back("src/" + v.file);
      put(out / "src" / v.file,
          fmt::format("// {}: general variant (any shape), its config generalised from the one tuned for [{}], built "
                      "by `{}`\n{}",
                      k.name, fmt::join(v.shape, ", "), b.command, v.code.source));
      jk["general"].push_back({{"from_shape", v.shape}, {"entry", v.code.entry}, {"config", nlohmann::json::parse(v.config)}});
    }
    manifest["kernels"].push_back(jk);
  }
  for (const auto& [name, text] : b.support_files) put(out / "src" / name, text);
  put(out / "include" / (b.name + ".h"), header(b));
  put(out / "src" / (b.name + "_dispatch.cpp"), dispatch);
  put(out / "CMakeLists.txt", cmake_file(b, sources));
  put(out / (b.name + ".json"), manifest.dump(2) + "\n");
}

std::string py_string(const std::string& s) { return "\"" + runtime::escaped(s) + "\""; }

// A Python tuple of `items` (a 1-tuple keeps its comma).
std::string py_tuple(const std::vector<std::string>& items) {
  return items.size() == 1 ? "(" + items[0] + ",)" : fmt::format("({})", fmt::join(items, ", "));
}
std::string py_tuple_of(const std::vector<int64_t>& v) {
  std::vector<std::string> items;
  for (int64_t x : v) items.push_back(std::to_string(x));
  return py_tuple(items);
}

void write_python(const Build& b, const fs::path& out) {
  std::string table;
  for (const Kernel& k : b.kernels) {
    std::vector<std::string> rows, general_rows;
    auto module_of = [](const Variant& v) { return v.file.substr(0, v.file.size() - 3); };
    for (const Variant& v : k.tuned) {
      put(out / "modules" / v.file, fmt::format("# {} [{}]: tuned variant, config {}, built by `{}`\n{}", k.name,
                                                fmt::join(v.shape, ", "), v.config, b.command, v.code.source));
      rows.push_back(fmt::format("{}: {}", py_tuple_of(v.shape), py_string(module_of(v))));
      if (v.general >= 0)
        general_rows.push_back(fmt::format("{}: {}", py_tuple_of(v.shape), py_string(module_of(k.general[size_t(v.general)]))));
    }
    for (const Variant& v : k.general)
      put(out / "modules" / v.file,
          fmt::format("# {}: general variant (any shape), its config generalised from the one tuned for [{}], built by "
                      "`{}`\n{}",
                      k.name, fmt::join(v.shape, ", "), b.command, v.code.source));
    // Where each shape parameter is read: the first input dim that follows it.
    std::vector<std::string> seen(k.shape_names.size());
    int input = 0;
    for (const TensorArg& t : k.tensors) {
      if (t.output) continue;
      for (size_t d = 0; d < t.dims.size(); ++d)
        if (t.dims[d].param >= 0 && seen[size_t(t.dims[d].param)].empty())
          seen[size_t(t.dims[d].param)] = fmt::format("({}, {})", input, d);
      ++input;
    }
    // A general module's sizes: every axis' extent, then each tensor's dims, as (parameter,
    // fixed) pairs (parameter -1: the fixed number).
    std::vector<std::string> sizes, params;
    for (const Size& z : k.axes) sizes.push_back(fmt::format("({}, {})", z.param, z.fixed));
    for (const TensorArg& t : k.tensors)
      for (const Size& z : t.dims) sizes.push_back(fmt::format("({}, {})", z.param, z.fixed));
    for (const std::string& n : k.shape_names) params.push_back(py_string(n));
    table += fmt::format("    {}: {{\n        \"params\": {},\n        \"read_from\": {},\n        \"inputs\": {},\n"
                         "        \"modules\": {{{}}},\n        \"general\": {{{}}},\n        \"sizes\": {},\n"
                         "        \"no_general\": {},\n    }},\n",
                         py_string(k.name), py_tuple(params), py_tuple(seen), input, fmt::join(rows, ", "),
                         fmt::join(general_rows, ", "), py_tuple(sizes), py_string(k.no_general));
  }
  put(out / (b.name + ".py"), fmt::format(R"PY("""{0}: kernels built ahead of time by Deuteron for the {1} target.

  {2}

The modules (modules/*.py) are the target's generated code: one per tuned shape, and general
ones for any other shape. `run(kernel, *inputs)` runs the module built for the inputs' shape;
a shape that was not built runs the general module of the built shape nearest it (log-size
distance, as the C++ dispatch picks its fallback), which takes its sizes at call time. A kernel
without a general module raises LookupError for such a shape, naming why and the command that
builds it.
"""
import importlib.util
import math
import pathlib
import sys

KERNELS = {{
{3}}}

_HERE = pathlib.Path(__file__).resolve().parent
_loaded = {{}}


def shape_of(kernel, *inputs):
    """The kernel's shape parameters read from its inputs' dims."""
    k = KERNELS[kernel]
    if len(inputs) != k["inputs"]:
        raise TypeError(f"{{kernel}} takes {{k['inputs']}} tensors, got {{len(inputs)}}")
    return tuple(int(inputs[t].shape[d]) for t, d in k["read_from"])


def nearest(kernel, shape):
    """The built shape nearest `shape` by log-size distance."""
    def distance(s):
        return sum(math.log(a / b) ** 2 for a, b in zip(shape, s))
    return min(KERNELS[kernel]["modules"], key=distance)


def sizes_of(kernel, shape):
    """What a general module's run takes as `sizes`: every axis' extent, then each tensor's dims."""
    return tuple(shape[p] if p >= 0 else fixed for p, fixed in KERNELS[kernel]["sizes"])


def _load(name):
    if name not in _loaded:
        spec = importlib.util.spec_from_file_location(f"{0}_{{name}}", _HERE / "modules" / f"{{name}}.py")
        m = importlib.util.module_from_spec(spec)
        sys.dont_write_bytecode, before = True, sys.dont_write_bytecode
        try:
            spec.loader.exec_module(m)
        finally:
            sys.dont_write_bytecode = before
        _loaded[name] = m
    return _loaded[name]


def variant(kernel, shape):
    """(module name, general) for `shape`: its tuned module, else the general module of the
    nearest built shape."""
    if kernel not in KERNELS:
        raise KeyError(f"no kernel {{kernel!r}} in {0}: it has {{', '.join(KERNELS)}}")
    shape = tuple(shape)
    if any(s < 1 for s in shape):
        raise ValueError(f"{{kernel}}: sizes must be at least 1, got {{'x'.join(map(str, shape))}}")
    k = KERNELS[kernel]
    if shape in k["modules"]:
        return k["modules"][shape], False
    near = nearest(kernel, shape)
    if near not in k["general"]:
        raise LookupError(
            f"{{kernel}}: no module for {{'x'.join(map(str, shape))}} and no general one ({{k['no_general']}}); "
            f"the nearest built is {{'x'.join(map(str, near))}}; build it: deuteron aot {{kernel}} --target {1} "
            f"--shapes {{'x'.join(map(str, shape))}} --out ...")
    return k["general"][near], True


def module(kernel, shape):
    """The module that runs `shape` (a tuple of the kernel's parameters)."""
    return _load(variant(kernel, shape)[0])


def run(kernel, *inputs, **options):
    """Runs `kernel` on `inputs` with the module for their shape (a general one passes the sizes)."""
    shape = shape_of(kernel, *inputs)
    name, general = variant(kernel, shape)
    if general:
        options["sizes"] = sizes_of(kernel, shape)
    return _load(name).run(*inputs, **options)
)PY",
                                          b.name, b.target, b.command, table));
}

}  // namespace

void write(const Build& b, const fs::path& out) {
  if (b.language == "c++") write_cpp(b, out);
  else write_python(b, out);
}

}  // namespace deuteron::cli::aot
