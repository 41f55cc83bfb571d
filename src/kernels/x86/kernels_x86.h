// Declarations of the x86 vector kernels (definitions in *_avx2.cpp / *_avx512.cpp).
#pragma once

#include <cstdint>

#include "kernels/kquant.h"
#include "kernels/ops.h"
#include "kernels/q8.h"

namespace mr::x86 {

void MatmulQ8Avx2(const QMatrix& w, const int8_t* xq, const float* xs, int64_t n_rows, float* y, int64_t ldy,
                  int64_t t_begin, int64_t t_end);
void MatmulQ8GluAvx2(const QMatrix& gate, const QMatrix& up, const int8_t* xq, const float* xs, int64_t n_rows,
                     GluAct act, float* y, int64_t ldy, int64_t t_begin, int64_t t_end);
void AttentionGqaAvx2(const AttnChunk& a, float* scratch);
void AttentionGqaAvx512(const AttnChunk& a, float* scratch);
void AttentionGqaAvx512Bf16(const AttnChunk& a, float* scratch);  // AVX512-BF16 (attention_bf16_avx512.cpp)
// KernelTable::kv_block_pairs of the avx512bf16 variant (LoadKvBlockPairs' words).
void KvBlockPairsAvx512Bf16(const uint16_t* k, const uint16_t* v, int64_t kv_stride, int64_t hd, uint32_t* kb,
                            uint32_t* vb);
void AttentionGqaAmx(const AttnChunk& a, float* scratch);  // AMX-BF16 (attention_amx_avx512.cpp)
void QuantizeActsAvx2(const float* x, int64_t n_rows, int64_t cols, int8_t* q, float* scales);
void GluAvx2(const float* g, const float* u, int64_t n, GluAct act, float* out);

void MatmulQ8Avx512(const QMatrix& w, const int8_t* xq, const float* xs, int64_t n_rows, float* y, int64_t ldy,
                    int64_t t_begin, int64_t t_end);
void MatmulQ8GluAvx512(const QMatrix& gate, const QMatrix& up, const int8_t* xq, const float* xs, int64_t n_rows,
                       GluAct act, float* y, int64_t ldy, int64_t t_begin, int64_t t_end);

// Native K-quant kernels (kquant.h; KernelTable::matmul_k / matmul_k_glu).
#define MR_DECLARE_K_KERNELS(Fmt, Isa)                                                                            \
  void Matmul##Fmt##Isa(const KMatrix& w, const QActs& x, int64_t n_rows, float* y, int64_t ldy, int64_t t_begin, \
                        int64_t t_end);                                                                           \
  void Matmul##Fmt##Glu##Isa(const KMatrix& gate, const KMatrix& up, const QActs& x, int64_t n_rows, GluAct act,  \
                             float* y, int64_t ldy, int64_t t_begin, int64_t t_end);
MR_DECLARE_K_KERNELS(Q4K, Avx2)
MR_DECLARE_K_KERNELS(Q6K, Avx2)
MR_DECLARE_K_KERNELS(Q50, Avx2)
MR_DECLARE_K_KERNELS(Q41, Avx2)
MR_DECLARE_K_KERNELS(Q80, Avx2)
MR_DECLARE_K_KERNELS(Q40, Avx2)
MR_DECLARE_K_KERNELS(Q5K, Avx2)
MR_DECLARE_K_KERNELS(F16, Avx2)
MR_DECLARE_K_KERNELS(BF16, Avx2)
MR_DECLARE_K_KERNELS(MXFP4, Avx2)
MR_DECLARE_K_KERNELS(Q4K, Avx512)
MR_DECLARE_K_KERNELS(Q6K, Avx512)
MR_DECLARE_K_KERNELS(Q50, Avx512)
MR_DECLARE_K_KERNELS(Q41, Avx512)
MR_DECLARE_K_KERNELS(Q80, Avx512)
MR_DECLARE_K_KERNELS(Q40, Avx512)
MR_DECLARE_K_KERNELS(Q5K, Avx512)
MR_DECLARE_K_KERNELS(F16, Avx512)
MR_DECLARE_K_KERNELS(BF16, Avx512)
MR_DECLARE_K_KERNELS(MXFP4, Avx512)
// AMX-INT8 (CpuVariant::kAmx): Q4_K, Q6_K, Q4_1, Q4_0, Q5_0 and Q8_0 with 16 or more rows on AMX tiles,
// fewer on the AVX-512 kernels (the AMX table takes Q5_K, MXFP4 and the float formats from AVX-512).
MR_DECLARE_K_KERNELS(Q4K, Amx)
MR_DECLARE_K_KERNELS(Q6K, Amx)
MR_DECLARE_K_KERNELS(Q41, Amx)
MR_DECLARE_K_KERNELS(Q40, Amx)
MR_DECLARE_K_KERNELS(Q50, Amx)
MR_DECLARE_K_KERNELS(Q80, Amx)
#undef MR_DECLARE_K_KERNELS
// Whether this process may use the AMX tile state (asked of the OS once, on the first call).
bool AmxPermitted();

}  // namespace mr::x86
