// One catalogue kernel at one dtype and shape: the parameter of the catalogue-wide test suites.
#pragma once

#include <ostream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include "deuteron/dtype.h"

namespace deuteron::testing_support {

struct Case {
  std::string kernel;
  DType dtype;
  std::vector<int64_t> shape;
};

// The test name's suffix: softmax_float32_130x300.
inline std::string case_name(const testing::TestParamInfo<Case>& info) {
  return fmt::format("{}_{}_{}", info.param.kernel, dtype_name(info.param.dtype), fmt::join(info.param.shape, "x"));
}

// How gtest prints a case (instead of its bytes) in listings and failures.
inline void PrintTo(const Case& c, std::ostream* os) {
  *os << fmt::format("{} {} [{}]", c.kernel, dtype_name(c.dtype), fmt::join(c.shape, ", "));
}

}  // namespace deuteron::testing_support
