#include "sched/scheduler.h"

#include <algorithm>
#include <cmath>

namespace mr::sched {

Scheduler::Scheduler(const Limits& limits) : limits_(limits) {
  limits_.max_active = std::max(1, limits_.max_active);
  limits_.max_queued = std::max(0, limits_.max_queued);
  limits_.step_rows = std::max<int64_t>(1, limits_.step_rows);
  limits_.prefill_chunk = std::max<int64_t>(1, limits_.prefill_chunk);
  limits_.min_prefill_rows = std::clamp<int64_t>(limits_.min_prefill_rows, 1, limits_.step_rows);
}

Admit Scheduler::Submit(SeqId id, int64_t prompt_tokens) {
  if (const Admit a = Peek(); a != Admit::kQueued) return a;
  if (queued_tokens_ + prompt_tokens > limits_.max_queued_tokens && !queue_.empty()) return Admit::kOverloaded;
  queue_.push_back(Seq{id, std::max<int64_t>(prompt_tokens, 1), 0, false, arrivals_++, 0});
  queued_tokens_ += queue_.back().prompt_left;
  return Admit::kQueued;
}

Admit Scheduler::Peek() const {
  if (!ready_) return Admit::kOverloaded;
  // Requests waiting for a free slot do not count against the queue: the next Plan takes them.
  if (static_cast<int>(active_.size() + queue_.size()) >= limits_.max_active + limits_.max_queued)
    return Admit::kQueueFull;
  return Admit::kQueued;
}

Scheduler::Seq* Scheduler::FindActive(SeqId id) {
  for (Seq& s : active_)
    if (s.id == id) return &s;
  return nullptr;
}

bool Scheduler::Cancel(SeqId id) {
  for (auto it = queue_.begin(); it != queue_.end(); ++it) {
    if (it->id == id) {
      queued_tokens_ -= it->prompt_left;
      queue_.erase(it);
      return true;
    }
  }
  if (Seq* s = FindActive(id)) s->cancelled = true;
  return false;
}

void Scheduler::Finish(SeqId id) {
  active_.erase(std::remove_if(active_.begin(), active_.end(), [id](const Seq& s) { return s.id == id; }),
                active_.end());
}

void Scheduler::Prefilled(SeqId id, int64_t rows) {
  if (Seq* s = FindActive(id)) s->prompt_left = std::max<int64_t>(0, s->prompt_left - rows);
}

void Scheduler::SetSpecRows(SeqId id, int64_t rows) {
  if (Seq* s = FindActive(id)) s->spec_rows = std::max<int64_t>(0, rows);
}

Plan Scheduler::Next() {
  Plan plan;
  // 1. Cancelled sequences leave first, so their slots can be reused in this very step.
  for (const Seq& s : active_)
    if (s.cancelled) plan.dropped.push_back(s.id);
  active_.erase(std::remove_if(active_.begin(), active_.end(), [](const Seq& s) { return s.cancelled; }),
                active_.end());
  // 2. Promote in arrival order.
  while (static_cast<int>(active_.size()) < limits_.max_active && !queue_.empty()) {
    queued_tokens_ -= queue_.front().prompt_left;
    plan.started.push_back(queue_.front().id);
    active_.push_back(queue_.front());
    queue_.pop_front();
  }
  // 3. Share the row budget.
  std::vector<Seq*> decoders, prefillers;
  for (Seq& s : active_) (s.prompt_left > 0 ? prefillers : decoders).push_back(&s);
  std::sort(prefillers.begin(), prefillers.end(), [](const Seq* a, const Seq* b) { return a->arrival < b->arrival; });
  // Longest-waiting decoders first (ties: oldest request).
  std::sort(decoders.begin(), decoders.end(), [](const Seq* a, const Seq* b) {
    return a->last_decode != b->last_decode ? a->last_decode < b->last_decode : a->arrival < b->arrival;
  });
  // The oldest prefill's guaranteed share (it never drops below one row while another row is
  // left for a decoder), every decoder's next row (taking turns when they do not all fit), then
  // speculative rows, then the rest of the prefill.
  // With nobody decoding, no stream waits on this step: a prefill may use a whole chunk even
  // when that is more than the step budget (larger chunks run the prefill kernels faster).
  int64_t budget = decoders.empty() ? std::max(limits_.step_rows, limits_.prefill_chunk) : limits_.step_rows;
  const int64_t dec_min = std::min<int64_t>(static_cast<int64_t>(decoders.size()), budget - 1);
  const int64_t reserve =
      prefillers.empty()
          ? 0
          : std::max<int64_t>(std::min({limits_.min_prefill_rows, prefillers.front()->prompt_left, budget - dec_min}),
                              0);
  const int64_t n_dec = std::min<int64_t>(static_cast<int64_t>(decoders.size()), budget - reserve);
  budget -= n_dec;
  int64_t spare = budget - reserve;
  for (int64_t i = 0; i < n_dec; ++i) {
    Seq* s = decoders[static_cast<size_t>(i)];
    const int64_t extra = std::min(s->spec_rows, spare);
    spare -= extra;
    budget -= extra;
    plan.work.push_back(Work{s->id, 1 + extra, false});
    s->last_decode = ++serve_clock_;
  }
  for (Seq* s : prefillers) {
    if (budget <= 0) break;
    const int64_t rows = std::min({limits_.prefill_chunk, s->prompt_left, budget});
    plan.work.push_back(Work{s->id, rows, true});
    budget -= rows;
  }
  return plan;
}

int Scheduler::RetryAfterSeconds(double prompt_tokens_per_s) const {
  if (prompt_tokens_per_s <= 0) return 1;
  const double s = static_cast<double>(queued_tokens_) / prompt_tokens_per_s;
  return std::clamp(static_cast<int>(std::ceil(s)), 1, 600);
}

}  // namespace mr::sched
