#include "runtime/prefix_cache.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "runtime/kv_disk_cache.h"

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
      budget_(opts.byte_budget),
      ttl_s_(opts.ttl_s),
      long_ttl_s_(opts.long_ttl_s),
      clock_(opts.clock),
      disk_(opts.disk) {}

double PrefixCache::Now() const {
  if (clock_) return clock_();
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

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
  if (it == map_.end() || it->second.parent != parent || it->second.expires < Now() ||
      !std::equal(block.begin(), block.end(), it->second.tokens.begin()))
    return nullptr;
  return &it->second;
}

const PrefixCache::Block* PrefixCache::FindOrLoad(uint64_t parent, std::span<const TokenId> block, uint64_t* hash) {
  if (const Block* b = Find(parent, block, hash)) return b;
  if (disk_ == nullptr || map_.count(*hash) != 0) return nullptr;  // expired or a collision: not here
  auto kv = std::make_shared<std::vector<uint16_t>>();
  if (!disk_->Load(*hash, parent, block, kv.get())) return nullptr;
  const Block* b = Insert(*hash, parent, block, std::move(kv));
  if (b != nullptr) stats_.disk_tokens += block_;
  return b;
}

int64_t PrefixCache::Match(std::span<const TokenId> tokens, int64_t max_len) const {
  const int64_t limit = std::min<int64_t>(max_len, static_cast<int64_t>(tokens.size()));
  uint64_t parent = 0;
  int64_t n = 0;
  while (n + block_ <= limit) {
    uint64_t h;
    if (Find(parent, tokens.subspan(n, block_), &h) == nullptr && (disk_ == nullptr || !disk_->Contains(h))) break;
    parent = h;
    n += block_;
  }
  return n;
}

void PrefixCache::Touch(uint64_t hash) {
  Block& b = map_.at(hash);
  lru_.splice(lru_.begin(), lru_, b.lru);
  b.expires = std::max(b.expires, Now() + (b.long_ttl ? long_ttl_s_ : ttl_s_));
}

int64_t PrefixCache::Restore(std::span<const TokenId> tokens, int64_t max_len, int64_t have, KvCache& kv) {
  ++stats_.lookups;
  Expire();
  const int64_t limit = std::min<int64_t>({max_len, static_cast<int64_t>(tokens.size()), kv.n_ctx});
  const size_t row = static_cast<size_t>(kv_dim_);
  const size_t rows = static_cast<size_t>(block_) * row;
  uint64_t parent = 0;
  int64_t n = 0;
  while (n + block_ <= limit) {
    uint64_t h;
    const Block* b = FindOrLoad(parent, tokens.subspan(n, block_), &h);
    if (b == nullptr) break;
    Touch(h);
    if (n + block_ > have) {
      // Copy only the rows the cache does not already hold.
      const int64_t from = std::max<int64_t>(have, n) - n;
      for (int64_t l = 0; l < n_layer_; ++l) {
        const uint16_t* src = b->kv->data() + static_cast<size_t>(l) * 2 * rows;
        uint16_t* k = kv.k[l].data() + static_cast<size_t>(n) * row;
        uint16_t* v = kv.v[l].data() + static_cast<size_t>(n) * row;
        std::memcpy(k + from * row, src + from * row, (rows - from * row) * sizeof(uint16_t));
        std::memcpy(v + from * row, src + rows + from * row, (rows - from * row) * sizeof(uint16_t));
        kv.InvalidatePairs(l, n + from);
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

void PrefixCache::Remove(std::unordered_map<uint64_t, Block>::iterator it) {
  if (it->second.parent != 0) {
    auto p = map_.find(it->second.parent);
    if (p != map_.end()) --p->second.children;
  }
  bytes_ -= BlockBytes();
  lru_.erase(it->second.lru);
  map_.erase(it);
}

int64_t PrefixCache::Expire() {
  const double now = Now();
  int64_t dropped = 0;
  // Leaves only: a block's descendants were used with it (so they expire no later than it), and
  // they were touched after it (nearer the front), so one pass from the front usually frees a
  // whole chain; another pass follows while one removed something.
  for (int64_t removed = 1; removed > 0; dropped += removed) {
    removed = 0;
    for (auto it = lru_.begin(); it != lru_.end();) {
      auto m = map_.find(*it++);  // Remove erases this entry, not the next
      if (m->second.children > 0 || m->second.expires >= now) continue;
      Remove(m);
      ++removed;
    }
  }
  stats_.expired_blocks += dropped;
  return dropped;
}

bool PrefixCache::EvictOne() {
  // Expired first, then short-lived, then any; the least recently used leaf within each.
  const double now = Now();
  for (int pass = 0; pass < 3; ++pass) {
    for (auto it = lru_.rbegin(); it != lru_.rend(); ++it) {
      auto m = map_.find(*it);
      const Block& b = m->second;
      if (b.children > 0) continue;
      if ((pass == 0 && b.expires >= now) || (pass == 1 && b.long_ttl)) continue;
      Remove(m);
      ++stats_.evicted_blocks;
      return true;
    }
  }
  return false;
}

const PrefixCache::Block* PrefixCache::Insert(uint64_t hash, uint64_t parent, std::span<const TokenId> block,
                                              std::shared_ptr<const std::vector<uint16_t>> kv) {
  if (BlockBytes() > budget_) return nullptr;
  // An expired entry under this hash (or a colliding one for another prefix) is replaced only
  // when it is a leaf.
  if (auto old = map_.find(hash); old != map_.end()) {
    if (old->second.children > 0) return nullptr;
    Remove(old);
  }
  // Keep the chain we are extending: pin the parent while evicting.
  Block* par = parent != 0 ? &map_.at(parent) : nullptr;
  if (par) ++par->children;
  while (bytes_ + BlockBytes() > budget_) {
    if (!EvictOne()) {
      if (par) --par->children;
      return nullptr;
    }
  }
  Block b;
  b.parent = parent;
  b.tokens.assign(block.begin(), block.end());
  b.kv = std::move(kv);
  b.expires = Now() + ttl_s_;
  lru_.push_front(hash);
  b.lru = lru_.begin();
  bytes_ += BlockBytes();
  return &map_.emplace(hash, std::move(b)).first->second;
}

void PrefixCache::Store(std::span<const TokenId> tokens, int64_t n, const KvCache& kv) {
  if (BlockBytes() > budget_) return;
  Expire();
  n = std::min<int64_t>({n, static_cast<int64_t>(tokens.size()), kv.n_past});
  const size_t row = static_cast<size_t>(kv_dim_);
  const size_t rows = static_cast<size_t>(block_) * row;
  uint64_t parent = 0;
  for (int64_t pos = 0; pos + block_ <= n; pos += block_) {
    const auto blk = tokens.subspan(pos, block_);
    uint64_t h;
    if (const Block* b = Find(parent, blk, &h)) {
      Touch(h);
      if (disk_ != nullptr) disk_->Save(h, parent, blk, b->kv);  // again, if the disk tier dropped it
      parent = h;
      continue;
    }
    if (auto it = map_.find(h); it != map_.end() && it->second.children > 0) return;  // a collision
    auto data = std::make_shared<std::vector<uint16_t>>(static_cast<size_t>(n_layer_) * 2 * rows);
    for (int64_t l = 0; l < n_layer_; ++l) {
      uint16_t* dst = data->data() + static_cast<size_t>(l) * 2 * rows;
      std::memcpy(dst, kv.k[l].data() + static_cast<size_t>(pos) * row, rows * sizeof(uint16_t));
      std::memcpy(dst + rows, kv.v[l].data() + static_cast<size_t>(pos) * row, rows * sizeof(uint16_t));
    }
    const Block* b = Insert(h, parent, blk, data);
    if (b == nullptr) return;
    stats_.stored_tokens += block_;
    if (disk_ != nullptr) disk_->Save(h, parent, blk, b->kv);
    parent = h;
  }
}

void PrefixCache::KeepLong(std::span<const TokenId> tokens, int64_t n) {
  n = std::min<int64_t>(n, static_cast<int64_t>(tokens.size()));
  uint64_t parent = 0;
  for (int64_t pos = 0; pos + block_ <= n; pos += block_) {
    uint64_t h;
    if (Find(parent, tokens.subspan(pos, block_), &h) == nullptr) return;
    map_.at(h).long_ttl = true;
    Touch(h);
    parent = h;
  }
}

void PrefixCache::Clear() {
  map_.clear();
  lru_.clear();
  bytes_ = 0;
}

}  // namespace mr
