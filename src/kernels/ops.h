// Kernel API and CPU-variant dispatch. Every kernel has a scalar FP32 reference in ref/ that
// stays in the tree as its oracle; x86/ holds the vector variants, compiled with the ISA flags
// their file suffix names and picked at start-up from cpuid + xgetbv (MERERUN_CPU overrides).
#pragma once

#include <cstdint>

#include "kernels/q8.h"

namespace mr {

enum class CpuVariant { kScalar = 0, kAvx2 = 1, kAvx512 = 2 };

const char* CpuVariantName(CpuVariant v);
// Best variant this CPU supports (cpuid + xgetbv: the OS must save the vector state).
CpuVariant DetectCpuVariant();
// DetectCpuVariant() unless MERERUN_CPU=scalar|avx2|avx512 asks for another; a request the
// CPU cannot run falls back to the best supported variant with a warning.
CpuVariant SelectedCpuVariant();
bool CpuSupports(CpuVariant v);

// Integer Q8/g64 kernels on quantized activations.
struct KernelTable {
  CpuVariant variant;
  // x (n_rows, cols) FP32 -> q (n_rows, cols) int8 + scales (n_rows, cols/64), symmetric per group.
  void (*quantize_acts)(const float* x, int64_t n_rows, int64_t cols, int8_t* q, float* scales);
  // y[r * ldy + o] = sum_i w[o][i] * xdeq[r][i], for r in [0, n_rows), o in [o_begin, o_end).
  // Streams each weight row once for up to 8 activation rows.
  void (*matmul_q8)(const QMatrix& w, const int8_t* xq, const float* xs, int64_t n_rows, float* y, int64_t ldy,
                    int64_t o_begin, int64_t o_end);
};

const KernelTable& GetKernels(CpuVariant v);

}  // namespace mr
