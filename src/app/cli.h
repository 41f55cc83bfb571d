// Command-line parsing for the subcommands, on CLI11 (Debian's libcli11-dev, header only).
// Every command builds a `Cli` (a CLI::App named "mererun CMD"), adds typed options bound to
// variables that hold their defaults (shown by --help), and calls Parse: --help prints the
// options with their defaults and exits 0; an unknown option, a missing value, or a value that
// does not convert or is out of range prints "mererun CMD: --option: ..." and exits 2.
#pragma once

#include <CLI/CLI.hpp>
#include <limits>
#include <optional>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

namespace mr::app {

constexpr int kUsageError = 2;     // exit status of every command-line mistake
constexpr int kVerdictFailed = 3;  // exit status of a qualification that ran and did not pass

class Cli {
 public:
  // `name` is the command as typed after "mererun" ("serve", "qualify speed").
  Cli(const std::string& name, const std::string& description);
  CLI::App& app() { return app_; }
  // Parses the arguments after the command name. Returns nullopt to go on, else the exit status
  // (0 after --help, kUsageError after printing the error).
  std::optional<int> Parse(const std::vector<std::string>& args);

 private:
  std::string name_;
  CLI::App app_;
};

namespace cli_detail {
template <class T>
std::string Str(T v) {
  std::ostringstream os;
  os << v;
  return os.str();
}
}  // namespace cli_detail

// Numeric bounds as validators: the value must convert to T (whole string, no overflow) and lie
// in [lo, hi]. `desc` is what --help and the error show, e.g. "0..65535" or ">= 1".
template <class T>
CLI::Validator Within(T lo, T hi, std::string desc) {
  return CLI::Validator(
      [lo, hi, desc](std::string& s) -> std::string {
        T v{};
        const bool negative_unsigned = std::is_unsigned_v<T> && s.find('-') != std::string::npos;  // strtoull wraps
        if (negative_unsigned || !CLI::detail::lexical_cast(s, v))
          return "'" + s + "' is not a valid number (want " + desc + ")";
        if (!(v >= lo && v <= hi)) return "must be " + desc + ", got " + s;
        return "";
      },
      desc);
}
template <class T>
CLI::Validator InRange(T lo, T hi) {
  return Within<T>(lo, hi, cli_detail::Str(lo) + ".." + cli_detail::Str(hi));
}
template <class T>
CLI::Validator AtLeast(T lo) {
  return Within<T>(lo, std::numeric_limits<T>::max(), ">= " + cli_detail::Str(lo));
}
// A real number > 0.
CLI::Validator Positive();

// "a,b" and repeated options both append; empty items are dropped.
std::vector<std::string> NonEmpty(std::vector<std::string> items);

}  // namespace mr::app
