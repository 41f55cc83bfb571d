#include "base/thread_pool.h"

#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <set>
#include <string>

namespace mr {

ThreadPool::ThreadPool(int n_threads) : n_threads_(n_threads < 1 ? 1 : n_threads) {
  for (int i = 1; i < n_threads_; ++i) workers_.emplace_back([this, i] { WorkerLoop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_start_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::ParallelFor(int64_t n, const std::function<void(int64_t, int64_t, int)>& fn) {
  if (n <= 0) return;
  if (n_threads_ == 1 || n == 1) {
    fn(0, n, 0);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    job_ = &fn;
    job_n_ = n;
    pending_ = n_threads_ - 1;
    ++generation_;
  }
  cv_start_.notify_all();
  const int64_t end0 = n / n_threads_;
  if (end0 > 0) fn(0, end0, 0);
  std::unique_lock<std::mutex> lock(mu_);
  cv_done_.wait(lock, [this] { return pending_ == 0; });
  job_ = nullptr;
}

void ThreadPool::WorkerLoop(int index) {
  uint64_t seen = 0;
  for (;;) {
    const std::function<void(int64_t, int64_t, int)>* job;
    int64_t n;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_start_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      job = job_;
      n = job_n_;
    }
    const int64_t begin = n * index / n_threads_;
    const int64_t end = n * (index + 1) / n_threads_;
    if (end > begin) (*job)(begin, end, index);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (--pending_ == 0) cv_done_.notify_one();
    }
  }
}

int ThreadPool::DefaultThreads() {
  if (const char* env = std::getenv("MERERUN_THREADS")) {
    int n = std::atoi(env);
    if (n > 0) return n;
  }
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
