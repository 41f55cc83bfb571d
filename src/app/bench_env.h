// Provenance and small utilities shared by the measurement programs (`mererun bench`,
// `mererun qualify`): where the source tree is, its git commit, the CPU, timing and medians,
// and running a helper process (node) with its stdout captured.
#pragma once

#include <chrono>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "base/status.h"

namespace mr::app {

// Root of the source tree the binary belongs to: <exe>/../.. when that holds tools/llamacpp
// (the binary is build*/bin/mererun), else the tree this file was compiled from; "" if neither.
std::string RepoRoot();

// {"commit": HEAD sha or null, "dirty": bool}, from `git -C RepoRoot() ...` at run time (the
// binary may be older than HEAD; "dirty" then says so only for uncommitted edits).
nlohmann::json GitInfo();

// {"model": /proc/cpuinfo "model name", "flags": the SIMD flags of interest present,
//  "logical_cpus": n, "mem_total_bytes": n}.
nlohmann::json CpuInfo();

// UTC now as "2026-12-02T17:00:00Z".
std::string UtcNow();

inline double SecondsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Median of v (mean of the two middle values for even sizes); 0 for an empty vector.
double Median(std::vector<double> v);

// POSIX shell single-quoting.
std::string ShellQuote(const std::string& s);

// Runs `command` with /bin/sh, stderr passed through; returns its stdout, or an error with the
// exit status when it fails.
Result<std::string> RunCapture(const std::string& command);

// sha256 of a model file: the catalog's when the file is a cached catalog model of the right
// size (hashing GiBs on every run is slow), else computed.
Result<std::string> ModelFileSha256(const std::string& path);

}  // namespace mr::app
