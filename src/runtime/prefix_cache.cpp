#include "runtime/prefix_cache.h"

#include <algorithm>
#include <cstring>

namespace mr {

namespace {
uint64_t Mix(uint64_t h, uint64_t v) {
  h ^= v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
  h *= 0xff51afd7ed558ccdULL;
  return h ^ (h >> 33);
}
}  // namespace

PrefixCache::PrefixCache(uint64_t config_key, int64_t n_layer, int64_t kv_dim, const Options& opts)
    : config_key_(config_key),
      n_layer_(n_layer),
      kv_dim_(kv_dim),
      block_(std::max<int64_t>(1, opts.block_tokens)),
      budget_(opts.byte_budget) {}

size_t PrefixCache::BlockBytes() const {
  return static_cast<size_t>(n_layer_) * 2 * static_cast<size_t>(block_ * kv_dim_) * sizeof(uint16_t);
}

uint64_t PrefixCache::ChainHash(uint64_t parent, std::span<const TokenId> block) const {
  uint64_t h = Mix(config_key_, parent);
  for (TokenId t : block) h = Mix(h, static_cast<uint32_t>(t));
  return h == 0 ? 1 : h;  // 0 means "no parent"
}

const PrefixCache::Block* PrefixCache::Find(uint64_t parent, std::span<const TokenId> block, uint64_t* hash) const {
  *hash = ChainHash(parent, block);
  auto it = map_.find(*hash);
  // A hash collision must not return another prefix's KV: compare parent and tokens.
  if (it == map_.end() || it->second.parent != parent ||
      !std::equal(block.begin(), block.end(), it->second.tokens.begin()))
    return nullptr;
  return &it->second;
}

int64_t PrefixCache::Match(std::span<const TokenId> tokens, int64_t max_len) const {
  const int64_t limit = std::min<int64_t>(max_len, static_cast<int64_t>(tokens.size()));
  uint64_t parent = 0;
  int64_t n = 0;
  while (n + block_ <= limit) {
    uint64_t h;
    if (Find(parent, tokens.subspan(n, block_), &h) == nullptr) break;
    parent = h;
    n += block_;
  }
  return n;
}

void PrefixCache::Touch(uint64_t hash) {
  Block& b = map_.at(hash);
  lru_.splice(lru_.begin(), lru_, b.lru);
}

int64_t PrefixCache::Restore(std::span<const TokenId> tokens, int64_t max_len, int64_t have, KvCache& kv) {
  ++stats_.lookups;
  const int64_t limit = std::min<int64_t>({max_len, static_cast<int64_t>(tokens.size()), kv.n_ctx});
  const size_t row = static_cast<size_t>(kv_dim_);
  const size_t rows = static_cast<size_t>(block_) * row;
  uint64_t parent = 0;
  int64_t n = 0;
  while (n + block_ <= limit) {
    uint64_t h;
    const Block* b = Find(parent, tokens.subspan(n, block_), &h);
    if (b == nullptr) break;
    Touch(h);
    if (n + block_ > have) {
      // Copy only the rows the cache does not already hold.
      const int64_t from = std::max<int64_t>(have, n) - n;
      for (int64_t l = 0; l < n_layer_; ++l) {
        const uint16_t* src = b->kv.data() + static_cast<size_t>(l) * 2 * rows;
        uint16_t* k = kv.k[l].data() + static_cast<size_t>(n) * row;
        uint16_t* v = kv.v[l].data() + static_cast<size_t>(n) * row;
        std::memcpy(k + from * row, src + from * row, (rows - from * row) * sizeof(uint16_t));
        std::memcpy(v + from * row, src + rows + from * row, (rows - from * row) * sizeof(uint16_t));
      }
    }
    parent = h;
    n += block_;
  }
  if (n > have) {
    stats_.hit_tokens += n - have;
    kv.n_past = n;
    return n;
  }
  return have;
}

bool PrefixCache::EvictOne() {
  // Least recently used block that no cached block extends.
  for (auto it = lru_.rbegin(); it != lru_.rend(); ++it) {
    auto m = map_.find(*it);
    if (m->second.children > 0) continue;
    if (m->second.parent != 0) {
      auto p = map_.find(m->second.parent);
      if (p != map_.end()) --p->second.children;
    }
    bytes_ -= BlockBytes();
    lru_.erase(std::next(it).base());
    map_.erase(m);
    ++stats_.evicted_blocks;
    return true;
  }
  return false;
}

void PrefixCache::Store(std::span<const TokenId> tokens, int64_t n, const KvCache& kv) {
  if (BlockBytes() > budget_) return;
  n = std::min<int64_t>({n, static_cast<int64_t>(tokens.size()), kv.n_past});
  const size_t row = static_cast<size_t>(kv_dim_);
  const size_t rows = static_cast<size_t>(block_) * row;
  uint64_t parent = 0;
  for (int64_t pos = 0; pos + block_ <= n; pos += block_) {
    const auto blk = tokens.subspan(pos, block_);
    uint64_t h;
    if (Find(parent, blk, &h) != nullptr) {
      Touch(h);
      parent = h;
      continue;
    }
    if (map_.count(h) != 0) return;  // a colliding entry for another prefix: stop here
    // Keep the chain we are extending: pin the parent while evicting.
    Block* par = parent != 0 ? &map_.at(parent) : nullptr;
    if (par) ++par->children;
    bool room = true;
    while (bytes_ + BlockBytes() > budget_) {
      if (!EvictOne()) {
        room = false;
        break;
      }
    }
    if (!room) {
      if (par) --par->children;
      return;
    }
    Block b;
    b.parent = parent;
    b.tokens.assign(blk.begin(), blk.end());
    b.kv.resize(static_cast<size_t>(n_layer_) * 2 * rows);
    for (int64_t l = 0; l < n_layer_; ++l) {
      uint16_t* dst = b.kv.data() + static_cast<size_t>(l) * 2 * rows;
      std::memcpy(dst, kv.k[l].data() + static_cast<size_t>(pos) * row, rows * sizeof(uint16_t));
      std::memcpy(dst + rows, kv.v[l].data() + static_cast<size_t>(pos) * row, rows * sizeof(uint16_t));
    }
    lru_.push_front(h);
    b.lru = lru_.begin();
    map_.emplace(h, std::move(b));
    bytes_ += BlockBytes();
    stats_.stored_tokens += block_;
    parent = h;
  }
}

void PrefixCache::Clear() {
  map_.clear();
  lru_.clear();
  bytes_ = 0;
}

}  // namespace mr
