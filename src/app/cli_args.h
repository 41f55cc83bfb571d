// Tiny argument helper for subcommands: flags are looked up by short/long name and consumed;
// Finish() reports anything left over as an error.
#pragma once

#include <cstdio>
#include <string>
#include <vector>

namespace mr::app {

class CliArgs {
 public:
  explicit CliArgs(std::vector<std::string> args) : args_(std::move(args)), used_(args_.size(), false) {}

  // Value of `-x VALUE` / `--long VALUE` / `--long=VALUE`, or `def` when absent.
  std::string Get(const std::string& short_name, const std::string& long_name, const std::string& def = "") {
    for (size_t i = 0; i < args_.size(); ++i) {
      if (used_[i]) continue;
      const std::string& a = args_[i];
      if ((a == short_name || a == long_name) && i + 1 < args_.size()) {
        used_[i] = used_[i + 1] = true;
        return args_[i + 1];
      }
      if (!long_name.empty() && a.rfind(long_name + "=", 0) == 0) {
        used_[i] = true;
        return a.substr(long_name.size() + 1);
      }
    }
    return def;
  }
  bool Flag(const std::string& name) {
    for (size_t i = 0; i < args_.size(); ++i) {
      if (!used_[i] && args_[i] == name) { used_[i] = true; return true; }
    }
    return false;
  }
  // Remaining positional arguments (not starting with '-').
  std::vector<std::string> Positional() {
    std::vector<std::string> out;
    for (size_t i = 0; i < args_.size(); ++i) {
      if (!used_[i] && (args_[i].empty() || args_[i][0] != '-')) { used_[i] = true; out.push_back(args_[i]); }
    }
    return out;
  }
  // False (after printing an error) when unknown arguments remain.
  bool Finish(const char* cmd) {
    for (size_t i = 0; i < args_.size(); ++i) {
      if (!used_[i]) {
        std::fprintf(stderr, "mererun %s: unknown or incomplete argument '%s'\n", cmd, args_[i].c_str());
        return false;
      }
    }
    return true;
  }

 private:
  std::vector<std::string> args_;
  std::vector<bool> used_;
};

}  // namespace mr::app
