// The per-sequence KV cache: BF16 rows of every layer's keys and values, in lazily resident
// anonymous mappings.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/ops.h"

namespace mr {

// A BF16 buffer of KV rows backed by an anonymous private mapping: pages cost no resident
// memory until written (untouched positions of a long-context cache are free), and Release()
// hands them back to the OS (they read as zero afterwards). Movable, not copyable.
class KvBuffer {
 public:
  KvBuffer() = default;
  explicit KvBuffer(size_t n);  // n uint16_t, zero; throws std::bad_alloc as operator new would
  KvBuffer(KvBuffer&& o) noexcept : p_(o.p_), n_(o.n_) {
    o.p_ = nullptr;
    o.n_ = 0;
  }
  KvBuffer& operator=(KvBuffer&& o) noexcept;
  KvBuffer(const KvBuffer&) = delete;
  KvBuffer& operator=(const KvBuffer&) = delete;
  ~KvBuffer();

  uint16_t* data() { return p_; }
  const uint16_t* data() const { return p_; }
  size_t size() const { return n_; }
  uint16_t* begin() { return p_; }
  uint16_t* end() { return p_ + n_; }
  const uint16_t* begin() const { return p_; }
  const uint16_t* end() const { return p_ + n_; }
  uint16_t& operator[](size_t i) { return p_[i]; }
  const uint16_t& operator[](size_t i) const { return p_[i]; }
  // Returns the pages to the OS (madvise MADV_DONTNEED); the contents read as zero after.
  void Release();

 private:
  uint16_t* p_ = nullptr;
  size_t n_ = 0;
};

// Per-sequence KV cache in BF16. k[l], v[l]: (n_ctx, n_head_kv * head_dim). Memory is lazy:
// a position costs resident memory only once written. Movable, not copyable.
//
// kp[l], vp[l]: copies of layer l's full blocks of kAttnPairBlock positions in the pair words the
// BF16 attention kernels read (KernelTable::kv_block_pairs, kernels/ops.h), so a decode step reads
// each block as it lies instead of transposing it again for every call. KPairs(l, h, hd) is KV
// head h's stream: its block b at word b * 16 * hd. Blocks [0, pair_blocks[l]) are current. They
// are derived data: k and v stay what everything else reads, and whoever writes rows of layer l
// from position p on calls InvalidatePairs(l, p). Empty until the fast path first fills them
// (AllocatePairs).
struct KvCache {
  int64_t n_ctx = 0;
  int64_t kv_dim = 0;
  int64_t n_past = 0;  // positions filled
  std::vector<KvBuffer> k, v;
  std::vector<KvBuffer> kp, vp;
  std::vector<int64_t> pair_blocks;

  KvCache() = default;
  KvCache(KvCache&&) noexcept = default;
  KvCache& operator=(KvCache&&) noexcept = default;
  KvCache(const KvCache&) = delete;
  KvCache& operator=(const KvCache&) = delete;

  // A cache of n_layer layers of (n_ctx, kv_dim) rows, empty (n_past 0, no resident pages).
  static KvCache Allocate(int64_t n_layer, int64_t n_ctx, int64_t kv_dim);
  size_t bytes() const;  // reserved (address space): n_ctx rows of every layer's k and v
  // Rows filled, n_past * kv_dim * 2 bytes * 2 (k, v) * n_layer, plus the current pair blocks.
  size_t bytes_in_use() const;
  // Reserves kp, vp (address space only) and marks no block current; no-op when already done.
  void AllocatePairs();
  // Rows of `layer` from position pos on changed: their pair blocks are no longer current.
  void InvalidatePairs(int64_t layer, int64_t pos) {
    if (!pair_blocks.empty()) pair_blocks[layer] = std::min(pair_blocks[layer], pos / kAttnPairBlock);
  }
  int64_t PairBlockCount() const { return (n_ctx + kAttnPairBlock - 1) / kAttnPairBlock; }
  // KV head h's pair blocks of layer `layer` (head size hd), block b at word b * 16 * hd.
  uint32_t* KPairs(int64_t layer, int64_t h, int64_t hd) { return PairStream(kp, layer, h, hd); }
  uint32_t* VPairs(int64_t layer, int64_t h, int64_t hd) { return PairStream(vp, layer, h, hd); }
  uint32_t* PairStream(std::vector<KvBuffer>& b, int64_t layer, int64_t h, int64_t hd) {
    return reinterpret_cast<uint32_t*>(b[layer].data()) + h * PairBlockCount() * 16 * hd;
  }
  // Empties the cache (n_past 0) and returns its pages to the OS; it stays usable.
  void Release();
};

}  // namespace mr
