// Errors: one hierarchy. Each says what went wrong, where in the user's kernel, and what to do.
#pragma once

#include <source_location>
#include <stdexcept>
#include <string>

namespace deuteron {

// Base of every error Deuteron throws. `where` is a "file:line" in the user's kernel when known.
class Error : public std::runtime_error {
 public:
  Error(const std::string& what, const std::string& where = "", const std::string& hint = "");
  const std::string& message() const { return message_; }
  const std::string& where() const { return where_; }
  const std::string& hint() const { return hint_; }

 private:
  std::string message_, where_, hint_;
};

// A mistake in the user's kernel, found while tracing or lowering it.
class KernelError : public Error { using Error::Error; };
// Arguments at call time that do not match what the kernel can take.
class ArgumentError : public Error { using Error::Error; };
// A config (pinned or from the tuner) that is illegal for the kernel or does not fit.
class ConfigError : public Error { using Error::Error; };
// A config whose blocks need more fast memory (L2 per thread, VMEM) than the target has.
class FastMemoryError : public ConfigError { using ConfigError::ConfigError; };
// The target's toolchain failed (C++ compiler, Python interpreter).
class CompileError : public Error { using Error::Error; };
// Anything at run time outside the user's control (I/O, dlopen, worker processes).
class RuntimeError : public Error { using Error::Error; };

// "file:line" of a source location, with the directory stripped for readability.
std::string format_location(const std::source_location& loc);

}  // namespace deuteron
