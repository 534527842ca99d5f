// The generated C++ reads like hand-written code, for every catalogue kernel: no `0 +` or
// `+ 0`, no constant declared and never used, comments that name the kernel's source lines
// rather than IR value ids, and <omp.h> rather than a hand-written declaration.
#include <map>
#include <regex>
#include <sstream>

#include <gtest/gtest.h>

#include "catalogue.h"
#include "driver/driver.h"

namespace deuteron {
namespace {

std::string emit_cpu(const examples::Entry& e) {
  auto args = e.inputs(e.small_shape, DType::f32, 1);
  auto s = driver::specialize(*e.kernel, frontend::describe_args(*e.kernel, args), "cpu");
  return s.backend->emit(driver::lower(s, s.space.default_config()));
}

TEST(GeneratedCode, ReadsLikeHandWrittenCode) {
  const std::regex zero_plus(R"((^|[^\w.])0 \+ )"), plus_zero(R"( \+ 0($|[^\w.]))");
  const std::regex constant(R"(^\s*constexpr int64_t (\w+) =)"), value_id(R"(//.*%\d)");
  for (const examples::Entry& e : examples::catalogue()) {
    std::string src = emit_cpu(e);
    EXPECT_NE(src.find("#include <omp.h>"), std::string::npos) << e.name;
    EXPECT_EQ(src.find("extern \"C\" int omp_"), std::string::npos) << e.name;
    std::istringstream in(src);
    int n = 0;
    for (std::string line; std::getline(in, line);) {
      ++n;
      std::string code = line.substr(0, line.find("//"));
      EXPECT_FALSE(std::regex_search(code, zero_plus)) << e.name << " line " << n << ": " << line;
      EXPECT_FALSE(std::regex_search(code, plus_zero)) << e.name << " line " << n << ": " << line;
      EXPECT_FALSE(std::regex_search(line, value_id)) << e.name << " line " << n << ": " << line;
      std::smatch m;
      if (std::regex_search(line, m, constant)) {
        const std::regex word("\\b" + m[1].str() + "\\b");
        auto uses = std::distance(std::sregex_iterator(src.begin(), src.end(), word), std::sregex_iterator());
        EXPECT_GT(uses, 1) << e.name << ": " << m[1] << " is declared and never used";
      }
    }
    // Group comments name the kernel's source file and line.
    EXPECT_NE(src.find(".cpp:"), std::string::npos) << e.name;
  }
}

}  // namespace
}  // namespace deuteron
