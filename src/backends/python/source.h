// Helpers for the Python source the Python-based targets generate: identifiers that cannot
// collide with a keyword or a module's own names, tuples, sizes for comments.
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "deuteron/dtype.h"
#include "ir/ops.h"

namespace deuteron::python {

// An identifier for a user's name (a tensor, scalar or axis): characters other than letters,
// digits and '_' become '_'; a name that is a Python keyword or one of `taken` (the module's
// own names: its imports, helpers) gets a trailing '_'.
std::string identifier(const std::string& name, const std::set<std::string>& taken);

// A float literal that reads back as the same double ("1.0", "0.1", "1e-05"); `inf` and `nan`
// spell the specials in the module's namespace ("jnp.inf", "float(\"inf\")").
std::string float_literal(double x, const std::string& inf, const std::string& nan);

// "(a,)" for one item, "(a, b)" otherwise.
std::string tuple(const std::vector<std::string>& items);

// "BLOCK_" + upper(axis) style constants.
std::string upper(std::string s);

// The integer and random functions every Python-based target spells as a call of a helper
// written into its module (each target writes the bodies in its own framework, with these names
// and torch's semantics): "_shl(a, b, 32)" (the operands' width), "_shr", "_remainder",
// "_floor_divide", "_rand", "_randn", "_randint". Empty for any other function.
std::string helper_call(ir::BinaryFn f, const std::string& a, const std::string& b, DType operands);

// "1.5 MiB", "3.0 KiB", "12 bytes": sizes in generated comments.
std::string human_bytes(int64_t bytes);

}  // namespace deuteron::python
