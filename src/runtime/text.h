// Text from users (kernel and argument names, paths) on its way into generated code, file
// names and line-based protocols. Every emitter goes through these, so that no name can end a
// comment, a docstring or a string literal early, start a new line of code, or a new command.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace deuteron::runtime {

// `s` as the body of a C-style escaped string: printable ASCII stays, except ' and " (written
// \' and \"); newline, carriage return and tab become \n, \r, \t; every other byte, the
// backslash included, becomes a three-digit octal escape (\134 for a backslash, \303\251 for
// "é"). The result is plain printable ASCII that never ends in a backslash: safe in C++ and
// Python comments, in docstrings, and inside quoted literals of either language, where it
// reads back as the original bytes.
std::string escaped(std::string_view s);

// An identifier of [A-Za-z0-9_]: every other byte becomes '_', a leading digit gets a '_' in
// front, and the empty name becomes "_".
std::string identifier(std::string_view s);

// A file name stem of [A-Za-z0-9_-] (other bytes become '_'), at most 64 bytes of the name;
// "kernel" when that leaves nothing.
std::string file_stem(std::string_view s);

// One field of a line-based protocol: '%', whitespace, control and non-ASCII bytes written as
// %XX, so that the field holds no space or newline whatever `s` is; and back (nullopt for a
// malformed escape).
std::string encode_field(std::string_view s);
std::optional<std::string> decode_field(std::string_view s);

}  // namespace deuteron::runtime
