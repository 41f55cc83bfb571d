// Admission and step planning for the engine thread: a pure policy module (no threads, no model,
// no clock), so every decision is unit-tested.
//
// Lifecycle of a request: Submit → (queued) → active (prefilling → decoding) → Finish / Cancel.
//  - Submit answers at once: admitted (queued, promoted by the next Plan when a slot is free),
//    or rejected with kQueueFull (HTTP 429 rate_limit_error) or kOverloaded (HTTP 529
//    overloaded_error: the queued prompt tokens exceed their budget, or the engine is not ready).
//    A rejection costs no model work.
//  - Plan() builds the next engine step: it drops cancelled sequences (returned so the engine
//    frees their KV and slot), promotes queued requests into free slots in arrival order, then
//    shares a row budget: every decoding sequence gets 1 row plus up to its speculative rows
//    (speculative rows are trimmed first when the budget is short, and decoders take turns when
//    even one row each does not fit); the rest goes to prefill chunks in arrival order, with at
//    least `min_prefill_rows` for the oldest prefill whenever one is pending, so a long prompt
//    always advances while other streams keep flowing.
//    When no sequence is decoding, the budget is at least one prefill chunk.
//  - The engine reports progress (Prefilled, SetSpecRows) and ends sequences (Finish).
//
// Thread-safety: none; the engine thread owns the Scheduler (HTTP threads talk to the engine
// through its queue, not to this object).
#pragma once

#include <cstdint>
#include <deque>
#include <vector>

namespace mr::sched {

using SeqId = uint64_t;

struct Limits {
  int max_active = 4;                   // sequences with a KV slot
  int max_queued = 16;                  // waiting for a slot; beyond: kQueueFull (429)
  int64_t max_queued_tokens = 1 << 20;  // prompt tokens waiting; beyond: kOverloaded (529)
  int64_t step_rows = 64;               // rows per engine step (all sequences together)
  int64_t prefill_chunk = 256;          // most rows one sequence prefills per step
  int64_t min_prefill_rows = 16;        // guaranteed to the oldest pending prefill per step
};

enum class Admit { kQueued, kQueueFull, kOverloaded };

struct Work {
  SeqId id = 0;
  int64_t rows = 0;  // prefill: prompt tokens to evaluate; decode: 1 + speculative rows
  bool prefill = false;
};

struct Plan {
  std::vector<SeqId> dropped;  // cancelled: free their KV and slot now
  std::vector<SeqId> started;  // promoted from the queue into a slot this step
  std::vector<Work> work;      // rows to run in this step
};

class Scheduler {
 public:
  explicit Scheduler(const Limits& limits);

  // ready=false (loading, draining): every request gets kOverloaded.
  void set_ready(bool ready) { ready_ = ready; }
  bool ready() const { return ready_; }

  Admit Submit(SeqId id, int64_t prompt_tokens);
  // What Submit would answer now for a prompt of unknown length (admits nothing): an early
  // refusal for a full scheduler before any work is spent on the request.
  Admit Peek() const;
  // Queued: removed at once (returns true: nothing to free). Active: dropped by the next Plan.
  bool Cancel(SeqId id);
  void Finish(SeqId id);  // the engine finished the sequence (stop, error): frees its slot

  // The engine sizes prefill chunks to a time budget as it measures its prefill rate.
  void set_prefill_chunk(int64_t rows) { limits_.prefill_chunk = rows < 1 ? 1 : rows; }
  int64_t prefill_chunk() const { return limits_.prefill_chunk; }
  void Prefilled(SeqId id, int64_t rows);    // prompt rows evaluated in the last step
  void SetSpecRows(SeqId id, int64_t rows);  // speculative rows the sequence wants per step

  Plan Next();

  int active() const { return static_cast<int>(active_.size()); }
  int queued() const { return static_cast<int>(queue_.size()); }
  int64_t queued_tokens() const { return queued_tokens_; }
  // Whole seconds a rejected client should wait, from the queued work and a throughput estimate.
  int RetryAfterSeconds(double prompt_tokens_per_s) const;

 private:
  struct Seq {
    SeqId id;
    int64_t prompt_left;
    int64_t spec_rows = 0;
    bool cancelled = false;
    uint64_t arrival;
    uint64_t last_decode = 0;  // serve_clock_ when it last got a decode row (round robin)
  };
  Seq* FindActive(SeqId id);

  Limits limits_;
  bool ready_ = true;
  uint64_t arrivals_ = 0;
  uint64_t serve_clock_ = 0;
  std::deque<Seq> queue_;
  std::vector<Seq> active_;
  int64_t queued_tokens_ = 0;
};

}  // namespace mr::sched
