#include "base/thread_pool.h"

#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <fstream>
#include <set>
#include <string>

namespace mr {

namespace {

// Spin iterations (each one pause instruction, ~10-50 ns) before a waiter sleeps: long enough
// to bridge the gap between consecutive ops of a forward pass, short enough not to burn a
// shared core while idle.
constexpr int kSpinIters = 1 << 8;

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

}  // namespace

ThreadPool::ThreadPool(int n_threads) : n_threads_(n_threads < 1 ? 1 : n_threads) {
  for (int i = 1; i < n_threads_; ++i) workers_.emplace_back([this, i] { WorkerLoop(i); });
}

ThreadPool::~ThreadPool() {
  stop_.store(true, std::memory_order_release);
  generation_.fetch_add(1, std::memory_order_acq_rel);
  generation_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::Run(int64_t n, FnRef fn) {
  if (n <= 0) return;
  if (n_threads_ == 1 || n == 1) {
    fn.call(fn.obj, 0, n, 0);
    return;
  }
  job_ = fn;
  job_n_ = n;
  pending_.store(n_threads_ - 1, std::memory_order_relaxed);
  generation_.fetch_add(1, std::memory_order_release);
  generation_.notify_all();
  const int64_t end0 = n / n_threads_;
  if (end0 > 0) fn.call(fn.obj, 0, end0, 0);
  for (int i = 0; i < kSpinIters; ++i) {
    if (pending_.load(std::memory_order_acquire) == 0) return;
    CpuRelax();
  }
  for (int p = pending_.load(std::memory_order_acquire); p != 0; p = pending_.load(std::memory_order_acquire)) {
    pending_.wait(p, std::memory_order_acquire);
  }
}

void ThreadPool::WorkerLoop(int index) {
  uint32_t seen = 0;
  for (;;) {
    uint32_t g = generation_.load(std::memory_order_acquire);
    for (int i = 0; g == seen && i < kSpinIters; ++i) {
      CpuRelax();
      g = generation_.load(std::memory_order_acquire);
    }
    while (g == seen) {
      generation_.wait(seen, std::memory_order_acquire);
      g = generation_.load(std::memory_order_acquire);
    }
    seen = g;
    if (stop_.load(std::memory_order_acquire)) return;
    const FnRef job = job_;
    const int64_t n = job_n_;
    const int64_t begin = n * index / n_threads_;
    const int64_t end = n * (index + 1) / n_threads_;
    if (end > begin) job.call(job.obj, begin, end, index);
    if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) pending_.notify_one();
  }
}

namespace {
std::atomic<int> g_default_threads{0};
}  // namespace

void ThreadPool::SetDefaultThreads(int n) {
  g_default_threads.store(n > 0 ? n : 0);
}

int ThreadPool::DefaultThreads() {
  if (const int n = g_default_threads.load(); n > 0) return n;
  // Physical cores: distinct (physical id, core id) pairs in /proc/cpuinfo.
  std::ifstream in("/proc/cpuinfo");
  std::set<std::pair<std::string, std::string>> cores;
  std::string line, phys = "0";
  while (std::getline(in, line)) {
    if (line.rfind("physical id", 0) == 0) phys = line.substr(line.find(':') + 1);
    if (line.rfind("core id", 0) == 0) cores.emplace(phys, line.substr(line.find(':') + 1));
  }
  long online = sysconf(_SC_NPROCESSORS_ONLN);
  int n = cores.empty() ? static_cast<int>(online) : static_cast<int>(cores.size());
  if (online > 0 && n > online) n = static_cast<int>(online);
  return n < 1 ? 1 : n;
}

}  // namespace mr
