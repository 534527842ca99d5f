// A small reader and writer for NumPy's .npy format (version 1.0 written; 1.0 to 3.0 read):
// the magic "\x93NUMPY", a version, a little-endian header length, a Python dict literal
// {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), } padded with spaces to a multiple
// of 64 bytes and ended by '\n', then the raw C-order data.
//
// bfloat16 has no NumPy dtype: it travels as '<u2' holding the raw bits (the convention of
// runtime/deuteron_runner.py, which is told the logical dtype with --dtypes).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "deuteron/tensor.h"

namespace deuteron::python {

// The .npy descr of a tensor dtype: '<f4', '<u2' (bfloat16 bits), '<f2', '<i4', '<i8', '|b1'.
std::string npy_descr(DType t);

// Writes the tensor's elements in row-major logical order (any strides). Throws RuntimeError
// naming the path on failure.
void write_npy(const std::filesystem::path& path, const Tensor& t);

struct NpyArray {
  std::string descr;
  std::vector<int64_t> shape;
  std::string data;  // raw bytes, C order
};

// Reads a C-order .npy file. Throws RuntimeError naming the path and the problem.
NpyArray read_npy(const std::filesystem::path& path);

// Copies an array into `out` after checking its shape and that its descr is `out`'s dtype's.
void copy_npy_into(const NpyArray& a, const Tensor& out, const std::string& what);

}  // namespace deuteron::python
