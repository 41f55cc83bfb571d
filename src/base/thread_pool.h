// A fixed pool of worker threads for data-parallel ops. ParallelFor(n, fn) calls
// fn(begin, end, thread) over a static split of [0, n) across the calling thread and the
// workers, and returns when all parts are done: one synchronization per op.
//
// Hand-off is a generation counter: idle workers spin on it briefly (an op follows the last
// one within microseconds during decode) and then sleep on it (std::atomic::wait, a futex on
// Linux), so a pool costs no CPU while the engine is idle. No allocation per call: the callable
// is passed by reference through a two-word FnRef, never copied into a std::function.
//
// Thread-safety: ParallelFor must be called from one thread at a time (the engine thread).
#pragma once

#include <atomic>
#include <cstdint>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

namespace mr {

class ThreadPool {
 public:
  // A non-owning reference to a callable fn(int64_t begin, int64_t end, int thread).
  struct FnRef {
    void* obj;
    void (*call)(void* obj, int64_t begin, int64_t end, int thread);
  };

  explicit ThreadPool(int n_threads);  // total threads including the caller; >= 1
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }
  // fn(begin, end, thread_index) over a static split of [0, n) into size() contiguous parts:
  // thread t gets [n*t/size, n*(t+1)/size). Parts may be empty (then fn is not called).
  template <class F>
  void ParallelFor(int64_t n, F&& fn) {
    using Fn = std::remove_reference_t<F>;
    FnRef ref{const_cast<void*>(static_cast<const void*>(&fn)),
              [](void* o, int64_t b, int64_t e, int t) { (*static_cast<Fn*>(o))(b, e, t); }};
    Run(n, ref, 0);
  }

  // fn(begin, end, thread_index) over [0, n) in chunks of `chunk` that the threads claim as they
  // go (an atomic counter): a thread that is slowed down (descheduled, or waiting longer on
  // memory) takes fewer chunks, so no thread idles at the end of the op waiting for it.
  // Chunks are claimed in increasing order. With one thread, or n <= chunk, fn runs once over
  // [0, n).
  template <class F>
  void ParallelForDynamic(int64_t n, int64_t chunk, F&& fn) {
    using Fn = std::remove_reference_t<F>;
    FnRef ref{const_cast<void*>(static_cast<const void*>(&fn)),
              [](void* o, int64_t b, int64_t e, int t) { (*static_cast<Fn*>(o))(b, e, t); }};
    Run(n, ref, chunk < 1 ? 1 : chunk);
  }
  // Physical cores, unless SetDefaultThreads chose a count (app/ maps MERERUN_THREADS onto it).
  static int DefaultThreads();
  static void SetDefaultThreads(int n);  // n <= 0: physical cores

 private:
  void Run(int64_t n, FnRef fn, int64_t chunk);  // chunk 0: static split
  // Runs job_ over chunks claimed from next_ until none is left.
  void RunChunks(int thread);
  void WorkerLoop(int index);

  int n_threads_;
  std::vector<std::thread> workers_;
  // Written by the caller before bumping generation_ (release), read by workers after (acquire).
  FnRef job_{nullptr, nullptr};
  int64_t job_n_ = 0;
  int64_t job_chunk_ = 0;
  alignas(64) std::atomic<int64_t> next_{0};
  alignas(64) std::atomic<uint32_t> generation_{0};
  alignas(64) std::atomic<int> pending_{0};
  std::atomic<bool> stop_{false};
};

}  // namespace mr
