// `deuteron aot`: ahead-of-time builds. aot_command.cpp tunes and emits the variants of each
// kernel (one per shape asked for, and general ones that read their sizes at run time);
// aot_writer.cpp writes them out with the entry points that dispatch between them: a C header,
// its C++ dispatch and a CMakeLists.txt (cpu), or Python modules and a dispatch table
// (pallas, triton). Nothing written depends on Deuteron.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "deuteron/dtype.h"

namespace deuteron::cli::aot {

// A size of the kernel's IR (an axis' extent, a tensor's dim) as the shape parameter it
// follows, or a fixed number (param < 0).
struct Size {
  int param = -1;
  int64_t fixed = 0;
};

struct TensorArg {
  std::string name;  // a C identifier
  bool output = false;
  DType dtype = DType::f32;
  std::vector<Size> dims;
};

struct Variant {
  std::vector<int64_t> shape;  // tuned: its shape; general: the tuned shape it was made from
  std::string config;          // as JSON
  std::string file;            // the source's name in the output
  backends::AotVariant code;
  int general = -1;  // tuned: the general variant serving shapes nearest this one (-1: none)
};

struct Kernel {
  std::string name;                      // the catalogue's name
  std::string ident;                     // as a C identifier
  std::vector<std::string> shape_names;  // "M", "N", ...
  std::vector<TensorArg> tensors;        // the IR's host tensors in order
  std::vector<std::string> scalars;      // scalar arguments
  std::vector<bool> scalar_integer;      // per scalar: an integer (an int64_t parameter, exact), else a double
  std::vector<Size> axes;                // the IR's axes, in order (general variants' `sizes`)
  std::vector<Variant> tuned, general;
  std::string no_general;  // why there is no general variant (empty: there is)
};

struct Build {
  std::string name;    // the library and the prefix of its functions
  std::string target;  // cpu, pallas, triton
  std::string language;  // Backend::aot_language
  DType dtype = DType::f32;
  std::string command;  // the command line that made it, for the files' headers
  std::vector<std::pair<std::string, std::string>> support_files;
  std::vector<Kernel> kernels;
};

// Writes `b` into `out` (created if missing); ArgumentError when it cannot be written.
void write(const Build& b, const std::filesystem::path& out);

}  // namespace deuteron::cli::aot
