// The scheduling policy: admission answers, promotion order, cancellation at each stage, row
// budgets with speculative rows, prefill interleaving and decoder fairness.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>

#include "sched/scheduler.h"

namespace mr::sched {
namespace {

int64_t RowsOf(const Plan& p, SeqId id, bool* prefill = nullptr) {
  for (const Work& w : p.work)
    if (w.id == id) {
      if (prefill) *prefill = w.prefill;
      return w.rows;
    }
  return 0;
}
int64_t TotalRows(const Plan& p) {
  int64_t n = 0;
  for (const Work& w : p.work) n += w.rows;
  return n;
}

TEST(Scheduler, AdmissionQueueFullAndOverloaded) {
  Limits l;
  l.max_active = 2;
  l.max_queued = 1;
  l.max_queued_tokens = 1000;
  Scheduler s(l);
  EXPECT_EQ(s.Submit(1, 10), Admit::kQueued);
  EXPECT_EQ(s.Submit(2, 10), Admit::kQueued);
  EXPECT_EQ(s.Peek(), Admit::kQueued);
  EXPECT_EQ(s.Submit(3, 10), Admit::kQueued);  // 2 take free slots, 1 waits in the queue
  EXPECT_EQ(s.Peek(), Admit::kQueueFull);      // the early answer agrees with Submit
  EXPECT_EQ(s.Submit(4, 10), Admit::kQueueFull);
  Plan p = s.Next();
  EXPECT_EQ(p.started, (std::vector<SeqId>{1, 2}));
  EXPECT_EQ(s.active(), 2);
  EXPECT_EQ(s.queued(), 1);
  EXPECT_EQ(s.Submit(5, 10), Admit::kQueueFull);
  s.Finish(1);
  EXPECT_EQ(s.Submit(5, 10), Admit::kQueued);  // a slot freed up
  // Token budget: a queue already holding work rejects a huge prompt as overloaded...
  Limits l2;
  l2.max_active = 1;
  l2.max_queued = 10;
  l2.max_queued_tokens = 100;
  Scheduler t(l2);
  EXPECT_EQ(t.Submit(1, 90), Admit::kQueued);
  EXPECT_EQ(t.Submit(2, 20), Admit::kOverloaded);
  // ...but a single request larger than the budget is not starved forever when alone.
  Scheduler u(l2);
  EXPECT_EQ(u.Submit(1, 5000), Admit::kQueued);
  u.set_ready(false);
  EXPECT_EQ(u.Peek(), Admit::kOverloaded);
  EXPECT_EQ(u.Submit(2, 1), Admit::kOverloaded);
  EXPECT_GE(u.RetryAfterSeconds(100.0), 50);
}

TEST(Scheduler, CancelWhileQueuedPrefillingAndDecoding) {
  Limits l;
  l.max_active = 1;
  l.max_queued = 4;
  l.step_rows = 8;
  l.prefill_chunk = 8;
  Scheduler s(l);
  s.Submit(1, 20);
  s.Submit(2, 20);
  s.Submit(3, 5);
  EXPECT_TRUE(s.Cancel(2));  // queued: gone at once
  EXPECT_EQ(s.queued(), 2);
  Plan p = s.Next();
  ASSERT_EQ(p.started, std::vector<SeqId>{1});
  EXPECT_EQ(RowsOf(p, 1), 8);
  s.Prefilled(1, 8);
  EXPECT_FALSE(s.Cancel(1));  // active, in prefill: dropped by the next plan
  p = s.Next();
  EXPECT_EQ(p.dropped, std::vector<SeqId>{1});
  EXPECT_EQ(p.started, std::vector<SeqId>{3});  // the freed slot is reused in the same step
  EXPECT_EQ(RowsOf(p, 3), 5);
  s.Prefilled(3, 5);
  p = s.Next();
  bool prefill = true;
  EXPECT_EQ(RowsOf(p, 3, &prefill), 1);
  EXPECT_FALSE(prefill);
  s.Cancel(3);  // decoding
  p = s.Next();
  EXPECT_EQ(p.dropped, std::vector<SeqId>{3});
  EXPECT_TRUE(p.work.empty());
  EXPECT_EQ(s.active(), 0);
  EXPECT_EQ(s.queued(), 0);
  EXPECT_EQ(s.queued_tokens(), 0);
}

TEST(Scheduler, SpeculativeRowsCountInTheBudgetAndAreTrimmedFirst) {
  Limits l;
  l.max_active = 4;
  l.step_rows = 10;
  Scheduler s(l);
  for (SeqId id = 1; id <= 3; ++id) s.Submit(id, 1);
  Plan p = s.Next();
  for (SeqId id = 1; id <= 3; ++id) s.Prefilled(id, 1);
  for (SeqId id = 1; id <= 3; ++id) s.SetSpecRows(id, 7);
  p = s.Next();
  EXPECT_EQ(TotalRows(p), 10);
  // Every decoder gets its row; the 7 spare rows go to speculation.
  for (SeqId id = 1; id <= 3; ++id) EXPECT_GE(RowsOf(p, id), 1);
  // A new arrival's prefill gets its guaranteed share even though decoders want everything.
  s.Submit(4, 100);
  p = s.Next();
  bool prefill = false;
  EXPECT_EQ(RowsOf(p, 4, &prefill), l.min_prefill_rows > 7 ? 7 : l.min_prefill_rows);
  EXPECT_TRUE(prefill);
  EXPECT_LE(TotalRows(p), 10);
  for (SeqId id = 1; id <= 3; ++id) EXPECT_GE(RowsOf(p, id), 1);
}

TEST(Scheduler, DecodersTakeTurnsWhenTheBudgetIsShortAndNobodyStarves) {
  Limits l;
  l.max_active = 8;
  l.step_rows = 3;
  Scheduler s(l);
  for (SeqId id = 1; id <= 8; ++id) s.Submit(id, 1);
  // Prefill all eight one-token prompts (the engine reports only what each plan ran).
  int prefilled = 0;
  for (int step = 0; step < 100 && prefilled < 8; ++step) {
    for (const Work& w : s.Next().work)
      if (w.prefill) {
        s.Prefilled(w.id, w.rows);
        ++prefilled;
      }
  }
  ASSERT_EQ(prefilled, 8) << "prefill starved by decoders";
  std::map<SeqId, int> served;
  std::map<SeqId, int> last_step;
  int max_gap = 0;
  for (int step = 1; step <= 80; ++step) {
    Plan p = s.Next();
    EXPECT_EQ(TotalRows(p), 3);
    for (const Work& w : p.work) {
      ++served[w.id];
      max_gap = std::max(max_gap, step - last_step[w.id]);
      last_step[w.id] = step;
    }
  }
  for (SeqId id = 1; id <= 8; ++id) EXPECT_EQ(served[id], 30) << id;  // 80 steps × 3 rows / 8
  EXPECT_LE(max_gap, 3);  // round robin: every decoder runs at least every ceil(8/3) steps
}

TEST(Scheduler, LongPrefillsAreChunkedAndInterleavedWithDecode) {
  Limits l;
  l.max_active = 2;
  l.step_rows = 64;
  l.prefill_chunk = 32;
  Scheduler s(l);
  s.Submit(1, 1);
  s.Next();
  s.Prefilled(1, 1);
  s.Submit(2, 7000);
  int steps = 0;
  int64_t done = 0;
  while (done < 7000) {
    Plan p = s.Next();
    ++steps;
    EXPECT_EQ(RowsOf(p, 1), 1) << "the running stream keeps flowing at step " << steps;
    bool prefill = false;
    const int64_t r = RowsOf(p, 2, &prefill);
    ASSERT_TRUE(prefill);
    ASSERT_GT(r, 0);
    EXPECT_LE(r, 32);
    s.Prefilled(2, r);
    done += r;
  }
  EXPECT_EQ(steps, (7000 + 31) / 32);
  Plan p = s.Next();
  EXPECT_EQ(RowsOf(p, 2), 1);  // decoding now
}

TEST(Scheduler, AloneAPrefillMayExceedTheStepBudget) {
  Limits l;
  l.max_active = 2;
  l.step_rows = 64;
  l.prefill_chunk = 256;
  Scheduler s(l);
  s.Submit(1, 1000);
  Plan p = s.Next();
  EXPECT_EQ(RowsOf(p, 1), 256);  // nobody decodes: a whole chunk
  s.Prefilled(1, 256);
  s.Submit(2, 1);
  for (int i = 0; i < 8 && RowsOf(p, 2) == 0; ++i) {  // oldest prefill first, then 2's one row
    p = s.Next();
    s.Prefilled(1, RowsOf(p, 1));
    s.Prefilled(2, RowsOf(p, 2));
  }
  ASSERT_EQ(RowsOf(p, 2), 1);
  p = s.Next();  // 2 decodes now: the step budget holds again
  EXPECT_EQ(RowsOf(p, 2), 1);
  EXPECT_LE(RowsOf(p, 1), 63);
}

TEST(Scheduler, RandomCancellationsLeakNoSlots) {
  Limits l;
  l.max_active = 4;
  l.max_queued = 8;
  l.step_rows = 32;
  Scheduler s(l);
  std::mt19937 rng(5);
  std::set<SeqId> live;  // submitted, not yet dropped/finished
  SeqId next = 1;
  for (int iter = 0; iter < 2000; ++iter) {
    const int action = static_cast<int>(rng() % 4);
    if (action == 0) {
      if (s.Submit(next, 1 + rng() % 100) == Admit::kQueued) live.insert(next);
      ++next;
    } else if (action == 1 && !live.empty()) {
      auto it = live.begin();
      std::advance(it, rng() % live.size());
      if (s.Cancel(*it)) live.erase(it);
    } else {
      Plan p = s.Next();
      for (SeqId id : p.dropped) live.erase(id);
      for (const Work& w : p.work) {
        if (w.prefill)
          s.Prefilled(w.id, w.rows);
        else if (rng() % 10 == 0) {
          s.Finish(w.id);
          live.erase(w.id);
        }
      }
    }
    ASSERT_LE(s.active(), l.max_active);
    ASSERT_LE(s.queued(), l.max_queued + l.max_active);
    ASSERT_EQ(static_cast<size_t>(s.active() + s.queued()), live.size());
  }
  for (SeqId id : std::set<SeqId>(live)) s.Cancel(id);
  Plan p = s.Next();
  EXPECT_EQ(s.active(), 0);
  EXPECT_EQ(s.queued(), 0);
  EXPECT_EQ(s.queued_tokens(), 0);
}

}  // namespace
}  // namespace mr::sched
