// Kernel API and CPU-variant dispatch. Every kernel has a scalar FP32 reference in ref/ that
// stays in the tree as its oracle; x86/ holds the vector variants, compiled with the ISA flags
// their file suffix names and picked at start-up from cpuid + xgetbv (MERERUN_CPU overrides).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "kernels/kquant.h"
#include "kernels/q8.h"

namespace mr {

// kAvx512Bf16: kAvx512 with attention on AVX512-BF16 dot products (the default on AMD: Zen 4 and
// later). kAmx: kAvx512 with AMX-INT8 tiles for the many-row (prefill) matmuls of Q4_K, Q6_K and
// the 32-input integer formats, and attention on AMX-BF16 tiles (Intel Sapphire Rapids and later;
// Linux grants the tile state per process).
enum class CpuVariant { kScalar = 0, kAvx2 = 1, kAvx512 = 2, kAmx = 3, kAvx512Bf16 = 4 };
constexpr CpuVariant kAllCpuVariants[] = {CpuVariant::kScalar, CpuVariant::kAvx2, CpuVariant::kAvx512,
                                          CpuVariant::kAvx512Bf16, CpuVariant::kAmx};
enum class GluAct { kSilu = 0, kGeluTanh = 1 };

const char* CpuVariantName(CpuVariant v);
// Best variant this CPU supports (cpuid + xgetbv: the OS must save the vector state).
CpuVariant DetectCpuVariant();
// DetectCpuVariant() unless RequestCpuVariant asked for another (app/ maps MERERUN_CPU =
// scalar|avx2|avx512|avx512bf16|amx onto it); a request the CPU cannot run falls back to the best supported
// variant with a warning.
CpuVariant SelectedCpuVariant();
void RequestCpuVariant(std::optional<CpuVariant> v);
// "scalar", "avx2", "avx512", "avx512bf16" or "amx" (CpuVariantName's names); false for anything else.
bool ParseCpuVariant(const std::string& name, CpuVariant* v);
// Every variant's name, ", " between them (for error messages).
std::string CpuVariantNames();
bool CpuSupports(CpuVariant v);

// Software prefetch distance of the weight-streaming tile kernels, bytes ahead of each read (0:
// none), set at start-up from the CPU vendor: 1024 on Intel, where the hardware prefetcher alone
// left one-row matmuls at 65-80 % of the memory bandwidth (Xeon with AMX, docs/performance.md stop
// 23); 0 on AMD, where Zen 4 showed no gain and a 4 KiB burst cost 20 % more CPU per token.
extern const int64_t kernel_prefetch_bytes;

// Integer Q8/g64 kernels on quantized activations. Weight matrices are packed (q8.h); a call
// covers output tiles [t_begin, t_end) (8 outputs each; the last tile of a matrix may be
// partial, only its real outputs are written), so threads split an op by tiles.
// Any number of activation rows: each weight tile is read once from memory for all rows
// (rows are processed in passes of up to 4 against the tile while it is in cache, and for
// many rows tiles are taken in L2-sized chunks: the blocked GEMM path of prefill).
// One attention call (KernelTable::attention): n_rows query rows of one sequence, each with the
// n_q query heads that share one KV head. Row r's heads are at q + r * q_stride (hd floats
// apart); it attends cache positions [lo[r], hi[r]) (lo < hi) and its output (n_q x hd) goes to
// out + r * out_stride. k, v point at the KV head's slice of position 0 (BF16, rows kv_stride
// elements apart): out_h = sum_j softmax_j(scale * q_h . k_j) v_j.
struct AttnChunk {
  const float* q;
  int64_t q_stride;
  int64_t n_rows, n_q, hd;
  const uint16_t* k;
  const uint16_t* v;
  int64_t kv_stride;
  const int64_t* lo;
  const int64_t* hi;
  float scale;
  float* out;
  int64_t out_stride;
  // Gemma 2's attention logit soft-capping: each scaled score s becomes softcap * tanh(s /
  // softcap) before the softmax; 0: none.
  float softcap = 0.0f;
  // gpt-oss's attention sinks: sinks[h] (h < n_q) is a logit that joins query head h's softmax
  // denominator, a position every row sees whose value is zero. Kernels start each (row, head)'s
  // online softmax from it: running max sinks[h], running sum 1. Null: none.
  const float* sinks = nullptr;
  // The KV head's blocks [0, pair_blocks) of kAttnPairBlock positions already in the pair words of
  // KernelTable::kv_block_pairs, block b at kpairs / vpairs + b * 16 * hd (KvCache::kp, vp): a
  // kernel that reads that layout uses them for its full blocks instead of converting k and v.
  // Null / 0: none.
  const uint32_t* kpairs = nullptr;
  const uint32_t* vpairs = nullptr;
  int64_t pair_blocks = 0;
};

// Cache positions per block of the pair-word layout (KernelTable::kv_block_pairs).
constexpr int64_t kAttnPairBlock = 32;
// Head sizes the BF16 attention kernels take (the others fall back to FP32 kernels).
constexpr bool PairLayoutHeadSize(int64_t hd) {
  return hd % 32 == 0 && hd <= 256;
}

struct KernelTable {
  CpuVariant variant;
  // x (n_rows, cols) FP32 -> q (n_rows, cols) int8 + scales (n_rows, cols/kActGroup), symmetric
  // per group: scale = amax/127, q = round(x/scale).
  void (*quantize_acts)(const float* x, int64_t n_rows, int64_t cols, int8_t* q, float* scales);
  // y[r * ldy + o] = sum_i w[o][i] * xdeq[r][i] for r < n_rows and o in the tiles' outputs.
  void (*matmul_q8)(const QMatrix& w, const int8_t* xq, const float* xs, int64_t n_rows, float* y, int64_t ldy,
                    int64_t t_begin, int64_t t_end);
  // y[r * ldy + o] = act(gate·x) * (up·x): gate and up projections with the GLU in one pass.
  void (*matmul_q8_glu)(const QMatrix& gate, const QMatrix& up, const int8_t* xq, const float* xs, int64_t n_rows,
                        GluAct act, float* y, int64_t ldy, int64_t t_begin, int64_t t_end);
  // Attention of a chunk of query rows of one sequence against one KV head (AttnChunk). Online
  // softmax over blocks of cache positions aligned to multiples of the kernel's block size, so a
  // row's result does not depend on the other rows of its chunk (bit-identical alone or together,
  // which greedy speculative decoding relies on); each K/V block is read and converted once for
  // every row and query head of the chunk. scratch: AttentionScratchFloats(n_rows, n_q, hd) floats.
  // The amx and avx512bf16 variants' kernels round each query head and each block of 32
  // probabilities to BF16 (round to nearest even) and accumulate their exact products in FP32 (on
  // AMX tiles / with vdpbf16ps), for head sizes that are a multiple of 32 up to 256
  // (attention_bf16); the others compute in FP32.
  void (*attention)(const AttnChunk& a, float* scratch);
  // out[i] = act(g[i]) * u[i] for i < n: the GLU of gate and up outputs computed apart (the fast
  // path's fine activations, model.h ActRole); out may alias g or u.
  void (*glu)(const float* g, const float* u, int64_t n, GluAct act, float* out);
  // Native K-quant kernels (kquant.h), indexed by KFormat, over output tiles [t_begin, t_end) of
  // kKTile = 16 outputs (only real outputs are written). x: rows [0, n_rows) quantized, with
  // ComputeSums done (the Q4_K minimum and Q6_K offset terms use the activation sums). Same
  // contract as matmul_q8 / matmul_q8_glu otherwise; each weight tile is read once from memory
  // for all rows (passes of up to 8 rows per super-block while it is in L1).
  void (*matmul_k[kKFormats])(const KMatrix& w, const QActs& x, int64_t n_rows, float* y, int64_t ldy, int64_t t_begin,
                              int64_t t_end);
  void (*matmul_k_glu[kKFormats])(const KMatrix& gate, const KMatrix& up, const QActs& x, int64_t n_rows, GluAct act,
                                  float* y, int64_t ldy, int64_t t_begin, int64_t t_end);
  bool attention_bf16 = false;
  // Null, or the conversion of kAttnPairBlock cache positions of one KV head (k, v: its slice of
  // the block's first position, rows kv_stride elements apart) into the pair words the variant's
  // attention kernel reads for head sizes with PairLayoutHeadSize (hd / 16 * 256 words each of kb
  // and vb, 64-byte aligned): the fast path keeps such copies of full blocks (AttnChunk::kpairs).
  void (*kv_block_pairs)(const uint16_t* k, const uint16_t* v, int64_t kv_stride, int64_t hd, uint32_t* kb,
                         uint32_t* vb) = nullptr;
};

// Largest block of cache positions any attention kernel uses (the scalar one; AVX2 uses 8,
// AVX-512 32): the unit of scratch sizes.
constexpr int64_t kAttnBlock = 64;
// The first 64-byte boundary at or after p: where the vector kernels put their block buffers, so
// that their vector loads do not span two cache lines (up to 15 floats of the scratch's slack:
// the AVX2 and AVX-512 kernels use 2 * 8 * hd and 2 * 32 * hd of its 2 * kAttnBlock * hd).
inline float* AlignAttentionScratch(float* p) {
  return p + (-reinterpret_cast<uintptr_t>(p) / sizeof(float) & 15);
}
inline int64_t AttentionScratchFloats(int64_t n_rows, int64_t n_q, int64_t hd) {
  // K^T and V of one block, then per (row, head): a block of probabilities, running max and sum;
  // the AMX kernel's per pair (padded to tiles of 16) BF16 query, FP32 output and positions, and
  // its score and probability tiles.
  return 2 * kAttnBlock * hd + (n_rows * n_q + 16) * (kAttnBlock + 2 + hd + hd / 2) + 1024;
}

const KernelTable& GetKernels(CpuVariant v);

}  // namespace mr
