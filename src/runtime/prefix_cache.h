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
// Thread-safety: none; the engine thread owns it.
#pragma once

#include <cstdint>
#include <list>
#include <span>
#include <unordered_map>
#include <vector>

#include "model/model.h"

namespace mr {

class PrefixCache {
 public:
  struct Options {
    size_t byte_budget = size_t{1} << 30;
    int64_t block_tokens = 128;
  };
  struct Stats {
    int64_t lookups = 0;
    int64_t hit_tokens = 0;     // tokens restored from the cache
    int64_t stored_tokens = 0;  // tokens newly stored
    int64_t evicted_blocks = 0;
  };

  PrefixCache(uint64_t config_key, int64_t n_layer, int64_t kv_dim, const Options& opts);

  // Length of the longest cached prefix of `tokens` (whole blocks, at most max_len).
  int64_t Match(std::span<const TokenId> tokens, int64_t max_len) const;

  // Copies the longest cached prefix of tokens[0..max_len) into kv rows [have, n) where `have`
  // rows of kv already hold the same tokens (they are not copied again). Sets kv.n_past = n when
  // n > have and returns n (or `have` when the cache holds nothing longer). Touches the blocks.
  int64_t Restore(std::span<const TokenId> tokens, int64_t max_len, int64_t have, KvCache& kv);

  // Stores every whole block of tokens[0..n) that is not cached yet, reading kv rows [0, n).
  // Evicts least recently used unreferenced blocks to stay within the byte budget; a block
  // larger than the whole budget is not stored.
  void Store(std::span<const TokenId> tokens, int64_t n, const KvCache& kv);

  void Clear();
  size_t bytes() const { return bytes_; }
  int64_t blocks() const { return static_cast<int64_t>(map_.size()); }
  int64_t block_tokens() const { return block_; }
  const Stats& stats() const { return stats_; }

 private:
  struct Block {
    uint64_t parent = 0;  // hash of the previous block (0 for the first)
    std::vector<TokenId> tokens;
    std::vector<uint16_t> kv;  // per layer: k rows then v rows, (block_tokens, kv_dim) each
    int children = 0;
    std::list<uint64_t>::iterator lru;  // position in lru_ (front: most recent)
  };
  uint64_t ChainHash(uint64_t parent, std::span<const TokenId> block) const;
  // The cached block for tokens [i*B, (i+1)*B) whose parent is `parent`, or nullptr.
  const Block* Find(uint64_t parent, std::span<const TokenId> block, uint64_t* hash) const;
  void Touch(uint64_t hash);
  bool EvictOne();
  size_t BlockBytes() const;

  uint64_t config_key_;
  int64_t n_layer_, kv_dim_, block_;
  size_t budget_;
  size_t bytes_ = 0;
  std::unordered_map<uint64_t, Block> map_;
  std::list<uint64_t> lru_;
  Stats stats_;
};

}  // namespace mr
