#include "model/kv_cache.h"

#include <sys/mman.h>

#include <algorithm>
#include <new>

#include "base/status.h"

namespace mr {

KvBuffer::KvBuffer(size_t n) : n_(n) {
  if (n == 0) return;
  void* p = mmap(nullptr, n * sizeof(uint16_t), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) throw std::bad_alloc();
  p_ = static_cast<uint16_t*>(p);
}

KvBuffer& KvBuffer::operator=(KvBuffer&& o) noexcept {
  if (this != &o) {
    if (p_) munmap(p_, n_ * sizeof(uint16_t));
    p_ = o.p_;
    n_ = o.n_;
    o.p_ = nullptr;
    o.n_ = 0;
  }
  return *this;
}

KvBuffer::~KvBuffer() {
  if (p_) munmap(p_, n_ * sizeof(uint16_t));
}

void KvBuffer::Release() {
  // The mapping starts on a page; the kernel rounds the length up to whole pages. Private
  // anonymous pages read as zero after MADV_DONTNEED, as in a fresh buffer.
  if (p_) MR_CHECK(madvise(p_, n_ * sizeof(uint16_t), MADV_DONTNEED) == 0);
}

KvCache KvCache::Allocate(int64_t n_layer, int64_t n_ctx, int64_t kv_dim) {
  MR_CHECK(n_layer >= 0 && n_ctx >= 0 && kv_dim >= 0);
  KvCache kv;
  kv.n_ctx = n_ctx;
  kv.kv_dim = kv_dim;
  kv.k.reserve(static_cast<size_t>(n_layer));
  kv.v.reserve(static_cast<size_t>(n_layer));
  for (int64_t l = 0; l < n_layer; ++l) {
    kv.k.emplace_back(static_cast<size_t>(n_ctx * kv_dim));
    kv.v.emplace_back(static_cast<size_t>(n_ctx * kv_dim));
  }
  return kv;
}

size_t KvCache::bytes() const {
  size_t b = 0;
  for (const auto& x : k) b += x.size() * 2;
  for (const auto& x : v) b += x.size() * 2;
  return b;
}

size_t KvCache::bytes_in_use() const {
  size_t b = static_cast<size_t>(n_past) * static_cast<size_t>(kv_dim) * 2 * 2 * k.size();
  for (const int64_t blocks : pair_blocks) b += static_cast<size_t>(blocks * kAttnPairBlock * kv_dim) * 2 * 2;
  return b;
}

void KvCache::AllocatePairs() {
  if (!pair_blocks.empty() || k.empty()) return;
  const auto n = static_cast<size_t>(PairBlockCount() * kAttnPairBlock * kv_dim);
  kp.reserve(k.size());
  vp.reserve(k.size());
  for (size_t l = 0; l < k.size(); ++l) {
    kp.emplace_back(n);
    vp.emplace_back(n);
  }
  pair_blocks.assign(k.size(), 0);
}

void KvCache::Release() {
  n_past = 0;
  for (auto& x : k) x.Release();
  for (auto& x : v) x.Release();
  for (auto& x : kp) x.Release();
  for (auto& x : vp) x.Release();
  std::fill(pair_blocks.begin(), pair_blocks.end(), 0);
}

}  // namespace mr
