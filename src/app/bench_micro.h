// Machine-level measurements for `mererun bench`: streaming memory-read bandwidth and the
// effective weight bandwidth of the Q8/g64 matmul kernel (kernels/ops.h KernelTable).
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/ops.h"
#include "kernels/weight_matrix.h"

namespace mr::app {

struct MemBandwidth {
  int n_threads = 0;
  int64_t buffer_bytes = 0;
  int reps = 0;
  double gbps_median = 0;  // 1e9 bytes/s
  double gbps_max = 0;
  // Bytes over the slowest thread's CPU time (CLOCK_THREAD_CPUTIME_ID): the bandwidth while the
  // threads actually run. On a shared, oversubscribed machine wall time includes time spent
  // descheduled; this does not (on an idle machine the two agree).
  double gbps_cpu_median = 0;
};

// Reads a buffer of `buffer_bytes` (>> LLC) end to end `reps` times with n_threads threads, each
// thread streaming its own contiguous part; per-rep bandwidth = bytes / wall time.
MemBandwidth MeasureMemBandwidth(int n_threads, int64_t buffer_bytes, int reps);

struct MatmulPoint {
  int64_t rows = 0, cols = 0;  // weight matrix (outputs, inputs)
  const char* format = "";     // WeightFormatName
  int n_act_rows = 0;          // activation rows multiplied per weight pass (1..8)
  int n_threads = 0;
  int iters = 0;
  double ms_median = 0;        // one matmul call
  double gbps_median = 0;      // weight bytes (in the format's own size) / time
  double gops_median = 0;      // 2 * rows * cols * n_act_rows / time, 1e9/s
  double gbps_cpu_median = 0;  // weight bytes / slowest thread's CPU time (see MemBandwidth)
};

// Times the kernel of `format` (weight_matrix.h) on a random (rows, cols) matrix for each
// activation-row count, split over n_threads by output tiles as the model does (cols % 256 == 0
// for the K-quant formats). Several copies of the matrix (together >= rotate_bytes) are used in
// turn so the weights stream from memory, not from the LLC.
std::vector<MatmulPoint> MeasureMatmul(const KernelTable& kernels, WeightFormat format, int64_t rows, int64_t cols,
                                       const std::vector<int>& act_rows, int n_threads, int iters,
                                       int64_t rotate_bytes);

}  // namespace mr::app
