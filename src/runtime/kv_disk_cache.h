// The prefix cache's second tier: KV blocks as files, so a long prompt prefix (Claude Code's
// ~12k-token system prompt and tools) is computed once per model and configuration, not once per
// server start.
//
// Layout: DIR/<configuration key, 16 hex>/<block hash, 16 hex>.kvb, one file per block:
//   header (64 bytes: magic "MRKVBLK1", configuration key, block hash, parent hash, block tokens,
//   layers, KV width, payload bytes, checksum), then the block's tokens (int32) and its KV rows
//   (uint16, per layer: k rows then v rows), all little endian.
// A block is found only through its parent, like in memory, and a file is used only if every
// header field and every token matches what the caller looks for and the checksum (Hash64 over
// header and payload) holds; anything else (a torn write, another version, bit rot) is deleted
// and counted, and the block is recomputed.
//
// Crash safety: a file is written under a temporary name in the same directory and renamed into
// place, so a reader sees a whole file or none; the checksum catches what a crash of the
// machine can still leave behind (no fsync is paid). Temporary files older than an hour are
// removed at open.
//
// Bounded in bytes over the whole DIR (every configuration together): the least recently used
// files go first, recency kept in the files' modification times (refreshed on each use), so it
// survives restarts. Several servers may share DIR: renames are atomic and a reader keeps an
// unlinked file open; each process bounds the bytes it knows of (approximate when shared).
//
// Writes are asynchronous: Save queues a block and a writer thread writes it; the engine thread
// never waits for the disk except in Load (one read of a block it is about to use).
//
// Thread-safety: Contains, Load, Save, Flush and stats may be called from any thread.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <list>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "base/status.h"
#include "model/model.h"

namespace mr {

class KvDiskCache {
 public:
  struct Options {
    std::string dir;                             // created if missing
    size_t byte_budget = size_t{4} << 30;        // all block files under dir together
    size_t max_pending_bytes = size_t{1} << 30;  // queued writes beyond this are dropped
  };
  struct Layout {
    uint64_t config_key = 0;
    int64_t n_layer = 0, kv_dim = 0, block_tokens = 0;
  };
  struct Stats {
    int64_t loaded = 0;    // blocks read and verified
    int64_t rejected = 0;  // files that failed verification (deleted)
    int64_t written = 0;   // blocks written
    int64_t failed = 0;    // writes that failed (disk full, permissions)
    int64_t dropped = 0;   // saves refused because too much was queued
    int64_t evicted = 0;   // files removed to stay within the budget
    size_t bytes = 0;      // block files under dir, as far as this process knows
    int64_t files = 0;
  };

  static Result<std::unique_ptr<KvDiskCache>> Open(const Options& opts, const Layout& layout);
  ~KvDiskCache();  // writes what is queued, then stops the writer
  KvDiskCache(const KvDiskCache&) = delete;
  KvDiskCache& operator=(const KvDiskCache&) = delete;

  // Whether a file for this block hash (of this configuration) is known; cheap (no I/O).
  bool Contains(uint64_t hash) const;
  // Reads and verifies the block; *kv gets n_layer * 2 * block_tokens * kv_dim values. False
  // when there is no such file or it does not verify (then it is deleted).
  bool Load(uint64_t hash, uint64_t parent, std::span<const TokenId> tokens, std::vector<uint16_t>* kv);
  // Queues the block to be written unless it is on disk or queued already. `kv` is shared with
  // the memory tier (immutable from here on).
  void Save(uint64_t hash, uint64_t parent, std::span<const TokenId> tokens,
            std::shared_ptr<const std::vector<uint16_t>> kv);
  // Waits until every queued block is written (or failed).
  void Flush();
  Stats stats() const;
  const std::string& dir() const { return config_dir_; }

 private:
  struct File {
    std::string path;
    size_t bytes = 0;
    uint64_t hash = 0;
    bool ours = false;  // of this configuration
  };
  struct Pending {
    uint64_t hash, parent;
    std::vector<TokenId> tokens;
    std::shared_ptr<const std::vector<uint16_t>> kv;
  };
  KvDiskCache(const Options& opts, const Layout& layout);
  Status Scan();
  void WriterLoop();
  bool Write(const Pending& p);  // writer thread
  void EvictFor(size_t bytes);   // under mu_
  void Forget(uint64_t hash);    // under mu_: drops our file's entry (already unlinked)
  size_t FileBytes() const;
  std::string PathOf(uint64_t hash) const;

  const Options opts_;
  const Layout layout_;
  std::string config_dir_;

  mutable std::mutex mu_;
  std::condition_variable cv_;       // writer: work or stop
  std::condition_variable idle_cv_;  // Flush: queue empty and nothing in flight
  std::list<File> lru_;              // front: most recent
  std::unordered_map<std::string, std::list<File>::iterator> by_path_;
  std::unordered_map<uint64_t, std::list<File>::iterator> ours_;
  std::deque<Pending> queue_;
  std::unordered_set<uint64_t> queued_;
  size_t pending_bytes_ = 0;
  bool writing_ = false;
  bool stop_ = false;
  Stats stats_;
  std::thread writer_;
};

}  // namespace mr
