// A fixed pool of worker threads for data-parallel ops. Run(n_tasks, fn) calls fn(task, thread)
// for every task in [0, n_tasks), split statically across the calling thread and the workers,
// and returns when all are done (one synchronization per op). No allocation per call.
//
// Thread-safety: Run must be called from one thread at a time (the engine thread).
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace mr {

class ThreadPool {
 public:
  explicit ThreadPool(int n_threads);  // total threads including the caller; >= 1
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }
  // fn(begin, end, thread_index) over a static split of [0, n) into size() contiguous parts.
  void ParallelFor(int64_t n, const std::function<void(int64_t, int64_t, int)>& fn);

  static int DefaultThreads();  // physical cores (MERERUN_THREADS overrides)

 private:
  void WorkerLoop(int index);

  int n_threads_;
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable cv_start_;
  std::condition_variable cv_done_;
  const std::function<void(int64_t, int64_t, int)>* job_ = nullptr;
  int64_t job_n_ = 0;
  uint64_t generation_ = 0;
  int pending_ = 0;
  bool stop_ = false;
};

}  // namespace mr
