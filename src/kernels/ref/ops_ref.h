// Scalar FP32 reference ops: the oracle for every fast kernel and the "reference" side of
// likelihood qualification. Clear over fast. Shapes in comments: (rows, cols) row-major.
#pragma once

#include <cstdint>

#include "kernels/ops.h"
#include "kernels/q8.h"

namespace mr::ref {

// Matrices in either storage order (q8.h).
// y[r*ldy + o] = sum_i deq(w)[o][i] * x[r*cols + i] for o in [o_begin, o_end). FP32 activations.
void MatmulQ8(const QMatrix& w, const float* x, int64_t n_rows, float* y, int64_t ldy, int64_t o_begin, int64_t o_end);
// Same on int8-quantized activations (reference for the integer kernels).
void MatmulQ8Int(const QMatrix& w, const int8_t* xq, const float* xs, int64_t n_rows, float* y, int64_t ldy,
                 int64_t o_begin, int64_t o_end);
// act(gate·x) * (up·x) per output (the fused GLU of the FFN), int8 activations.
void MatmulQ8IntGlu(const QMatrix& gate, const QMatrix& up, const int8_t* xq, const float* xs, int64_t n_rows,
                    GluAct act, float* y, int64_t ldy, int64_t o_begin, int64_t o_end);
// The scalar KernelTable entries: the two above over output tiles [t_begin, t_end) (ops.h).
void MatmulQ8Tiles(const QMatrix& w, const int8_t* xq, const float* xs, int64_t n_rows, float* y, int64_t ldy,
                   int64_t t_begin, int64_t t_end);
void MatmulQ8GluTiles(const QMatrix& gate, const QMatrix& up, const int8_t* xq, const float* xs, int64_t n_rows,
                      GluAct act, float* y, int64_t ldy, int64_t t_begin, int64_t t_end);
// Native K-quant matrices (kquant.h): weights dequantized to FP32 with ggml's arithmetic, dotted
// with the int8 activations (q * scale) in double; F16 / BF16 rows with the FP32 activations
// (QActs::x). The oracle of the native kernels.
void MatmulKInt(const KMatrix& w, const QActs& x, int64_t n_rows, float* y, int64_t ldy, int64_t o_begin,
                int64_t o_end);
void MatmulKIntGlu(const KMatrix& gate, const KMatrix& up, const QActs& x, int64_t n_rows, GluAct act, float* y,
                   int64_t ldy, int64_t o_begin, int64_t o_end);
// The scalar KernelTable::matmul_k / matmul_k_glu entries: the two above over tiles of 16 outputs.
void MatmulKTiles(const KMatrix& w, const QActs& x, int64_t n_rows, float* y, int64_t ldy, int64_t t_begin,
                  int64_t t_end);
void MatmulKGluTiles(const KMatrix& gate, const KMatrix& up, const QActs& x, int64_t n_rows, GluAct act, float* y,
                     int64_t ldy, int64_t t_begin, int64_t t_end);
// KernelTable::attention (ops.h), scalar: each row alone, blocks of kAttnBlock positions.
void AttentionGqa(const AttnChunk& a, float* scratch);
// Per row, per kActGroup-input group symmetric int8 quantization: scale = amax/127, q = round(x/scale).
void QuantizeActs(const float* x, int64_t n_rows, int64_t cols, int8_t* q, float* scales);
// sum_i a[i] * b[i] in FP32, in 8 interleaved partial sums added pairwise (the reference path's
// matmul order, which the fast path's exact logits reuse).
float Dot8(const float* a, const float* b, int64_t n);
// Dot8 of four vectors a[0..3] with the same b: out[k] == Dot8(a[k], b, n) bit for bit (each
// output's products and sums in Dot8's order), with four times the independent work per step.
void Dot8x4(const float* const a[4], const float* b, int64_t n, float out[4]);

// out = x / rms(x) * w over n elements (out may alias x).
void RmsNorm(const float* x, const float* w, int64_t n, float eps, float* out);
// Rotary embedding of one head vector of size head_dim at position pos.
// neox: rotate pairs (i, i + head_dim/2); otherwise adjacent pairs (2i, 2i+1). freq_factors
// (head_dim/2, optional): pair i's angle is divided by freq_factors[i] (Llama 3.x rope_freqs).
void Rope(float* v, int64_t head_dim, int64_t pos, float freq_base, bool neox, const float* freq_factors = nullptr);
void Softmax(float* x, int64_t n);
float Silu(float x);
float GeluTanh(float x);  // 0.5x(1+tanh(sqrt(2/pi)(x+0.044715x^3)))
// out[i] = act(g[i]) * u[i] (KernelTable::glu).
void Glu(const float* g, const float* u, int64_t n, GluAct act, float* out);

}  // namespace mr::ref
