// KV reuse across requests: the KV rows of token prefixes, stored in fixed-size token blocks
// keyed by a hash chain over (configuration key, every token up to the block's end), bounded by
// a byte budget with LRU eviction of unreferenced entries (blocks that no longer cached block
// extends).
//
// A block's KV depends on every earlier token, so a block is found only through its parent: the
// longest cached prefix of a prompt is found block by block from the start. The configuration key
// must include the model and everything that changes arithmetic (weight format, kernel variant,
// experiment controls), so a prefix is never reused by a different computation.
//
// Lifetimes follow Anthropic's prompt caching: a block lives `ttl_s` (5 minutes) after its last
// use, or `long_ttl_s` (1 hour) once a request asked for the longer lifetime over it (KeepLong);
// each hit refreshes it. An expired block is dropped and never restored. Under memory pressure
// expired blocks go first, then short-lived ones, then long-lived ones, least recently used
// first within each.
//
// An optional disk tier (KvDiskCache, not owned) receives every stored block and is read when
// the memory tier does not hold the next block of a prompt; a block read back starts a fresh
// lifetime in memory. The disk tier has no lifetimes, only its byte bound.
//
// Thread-safety: none; the engine thread owns it.
#pragma once

#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

#include "model/model.h"

namespace mr {

class KvDiskCache;

class PrefixCache {
 public:
  struct Options {
    size_t byte_budget = size_t{1} << 30;
    int64_t block_tokens = 128;
    double ttl_s = 300.0;           // "5m"
    double long_ttl_s = 3600.0;     // "1h"
    std::function<double()> clock;  // seconds, monotonic; default: steady_clock
    KvDiskCache* disk = nullptr;    // optional second tier, not owned; must outlive the cache
  };
  struct Stats {
    int64_t lookups = 0;
    int64_t hit_tokens = 0;     // tokens restored from the cache
    int64_t stored_tokens = 0;  // tokens newly stored
    int64_t evicted_blocks = 0;
    int64_t expired_blocks = 0;  // dropped at the end of their lifetime
    int64_t disk_tokens = 0;     // of hit_tokens, read from the disk tier
  };

  PrefixCache(uint64_t config_key, int64_t n_layer, int64_t kv_dim, const Options& opts);

  // Length of the longest cached prefix of `tokens` (whole blocks, at most max_len), counting
  // blocks the disk tier holds too.
  int64_t Match(std::span<const TokenId> tokens, int64_t max_len) const;

  // Copies the longest cached prefix of tokens[0..max_len) into kv rows [have, n) where `have`
  // rows of kv already hold the same tokens (they are not copied again). Sets kv.n_past = n when
  // n > have and returns n (or `have` when the cache holds nothing longer). Refreshes the
  // lifetime of every block of the prefix (those under `have` too).
  int64_t Restore(std::span<const TokenId> tokens, int64_t max_len, int64_t have, KvCache& kv);

  // Stores every whole block of tokens[0..n) that is not cached yet, reading kv rows [0, n).
  // Evicts least recently used unreferenced blocks to stay within the byte budget; a block
  // larger than the whole budget is not stored.
  void Store(std::span<const TokenId> tokens, int64_t n, const KvCache& kv);

  // Gives the cached blocks of tokens[0..n) the long lifetime from now on (sticky).
  void KeepLong(std::span<const TokenId> tokens, int64_t n);

  // Drops every expired block (also done by Restore and Store). Returns how many.
  int64_t Expire();

  void Clear();
  size_t bytes() const { return bytes_; }
  int64_t blocks() const { return static_cast<int64_t>(map_.size()); }
  int64_t block_tokens() const { return block_; }
  const Stats& stats() const { return stats_; }

 private:
  struct Block {
    uint64_t parent = 0;  // hash of the previous block (0 for the first)
    std::vector<TokenId> tokens;
    // Per layer: k rows then v rows, (block_tokens, kv_dim) each. Immutable once stored (shared
    // with the disk tier's write queue).
    std::shared_ptr<const std::vector<uint16_t>> kv;
    int children = 0;
    bool long_ttl = false;
    double expires = 0.0;               // clock seconds
    std::list<uint64_t>::iterator lru;  // position in lru_ (front: most recent)
  };
  double Now() const;
  uint64_t ChainHash(uint64_t parent, std::span<const TokenId> block) const;
  // The cached, unexpired block for tokens [i*B, (i+1)*B) whose parent is `parent`, or nullptr.
  const Block* Find(uint64_t parent, std::span<const TokenId> block, uint64_t* hash) const;
  // Find, then the disk tier (the block read back is inserted); nullptr when neither has it.
  const Block* FindOrLoad(uint64_t parent, std::span<const TokenId> block, uint64_t* hash);
  // Inserts a new block after `parent` (pinned while evicting); nullptr when there is no room.
  const Block* Insert(uint64_t hash, uint64_t parent, std::span<const TokenId> block,
                      std::shared_ptr<const std::vector<uint16_t>> kv);
  void Touch(uint64_t hash);
  void Remove(std::unordered_map<uint64_t, Block>::iterator it);
  bool EvictOne();
  size_t BlockBytes() const;

  uint64_t config_key_;
  int64_t n_layer_, kv_dim_, block_;
  size_t budget_;
  double ttl_s_, long_ttl_s_;
  std::function<double()> clock_;
  KvDiskCache* disk_;
  size_t bytes_ = 0;
  std::unordered_map<uint64_t, Block> map_;
  std::list<uint64_t> lru_;
  Stats stats_;
};

}  // namespace mr
