// schedule: a deterministic op order with a low peak of live intermediate bytes.
//
// Algorithm, per function (n ops, every size at the symbols' maxima):
//  1. Weigh values: an op result that is neither a `weight` op's nor a function result
//     weighs max_numel * dtype_size bytes; parameters, weights and results weigh 0.
//     Split the ops into lazy ones, computed from sources alone (sources are the ops
//     without operands: weights, constants, sinusoid tables, iotas; then e.g. a
//     transpose of a weight), and regular ones (everything that depends on a parameter).
//     Only the order of the regular ops is searched: `expand` places each lazy op right
//     before the first regular op that needs it (its lazy operands before it, in their
//     current order), and lazy ops no regular op needs at the end.
//  2. Greedy list scheduling of the regular ops. An op is ready once the regular ops
//     defining its operands are placed. Each step places the ready op with the smallest
//     net growth of live bytes: its result (if used later) plus the lazy operands placed
//     for it that outlive it, minus the operands whose last remaining use it is. Ties go
//     to the smaller transient (the bytes live while it runs), then to the op earlier in
//     the current order.
//  3. Refinement by sinking cones: walking a candidate order from its end, take each
//     regular op x with its cone (x and, transitively, the regular ops whose results
//     only the cone uses) and move the cone, in its order, to just before x's first user
//     (the end when it has none). Keep the move when it lowers the cost: the live bytes
//     of every step, sorted from the highest down and compared in that order (the peak,
//     then the next highest step, ...), so that clearing one of several equal peaks
//     (one per layer) counts as progress. So a chain that feeds a late user (say a
//     value projection read only after the softmax) leaves the peak as a whole, which
//     the greedy walk alone does not see. Up to kMaxSweeps sweeps, until one keeps no
//     move.
//  4. Candidates, in order of preference: the current order expanded (lazy ops sunk),
//     the greedy order refined, the current order refined. The one with the lowest peak
//     wins, ties going to the earlier; if that peak were above the current order's (a
//     lazy op sunk past the point where its operands died), the current order stays. So
//     the peak never grows and an order that is already good is kept as it is.
// Cost: O((n + uses * arity) log n) for the greedy walk (ready ops ordered by cost, only
// those whose cost a step changed re-costed); refinement costs each trial move on the
// stretch of the order it reorders only (OrderState), grows cones with counts instead of
// rescanning users, and stops after kWorkBase + kWorkPerOp * n steps of work, so it is
// O(n log n + sweeps * uses) too: a graph of 10^5 ops, wide or long, is scheduled in one or
// two seconds. (Before, the greedy walk scanned every ready op per step and every trial was
// costed over the whole order: 677 s for 25000 chains off one value.) Only op indices and
// positions decide anything, so the result is the same on every run.
#include "passes/schedule.h"

#include <algorithm>
#include <cstdint>
#include <functional>
#include <set>
#include <tuple>
#include <vector>

#include "passes/rewrite.h"
#include "support/error.h"

namespace kiln::passes {
namespace {

constexpr const char* kPass = "schedule";
constexpr int kMaxSweeps = 4;
// The most work refinement spends on one order, in steps (an operand of a cone op looked
// at, a sequence position or an expanded step of a stretch costed): kWorkBase plus
// kWorkPerOp per op, so refinement is O(n log n) however far cones move (a graph of 10^5
// ops whose cones each cross most of it would otherwise take minutes). The base
// Transformer (~3000 ops) uses about 21000 steps, the tests' random graphs fewer: they
// never reach the bound.
constexpr int64_t kWorkBase = int64_t{1} << 20;
constexpr int64_t kWorkPerOp = 32;

// Bytes each value occupies while live, by ValueId (0 for values that are not counted).
std::vector<int64_t> value_weights(const ir::Module& m, const ir::Function& f) {
  std::vector<int64_t> w(f.values.size(), 0);
  for (const ir::Op& op : f.ops) {
    if (op.kind == ir::OpKind::weight) continue;
    const ir::TensorType& t = f.type(op.result);
    w[op.result] = ir::max_numel(m, t) * ir::dtype_size(t.dtype);
  }
  for (ir::ValueId r : f.results) w[r] = 0;
  return w;
}

// The cost of an order: the live bytes of each step, sorted from the highest down, so
// that comparing two costs compares the peaks, then the next highest steps, and so on
// (the same length for every order of one function).
struct Cost {
  std::vector<int64_t> profile;
  int64_t peak() const { return profile.empty() ? 0 : profile.front(); }
  bool operator<(const Cost& other) const { return profile < other.profile; }
};

// The cost of `order` (indices into f.ops, every op once): a value is live at every step
// from its definition to its last use, both included.
Cost cost_of_order(const ir::Function& f, const std::vector<int>& order,
                   const std::vector<int64_t>& weights) {
  const size_t n = order.size();
  std::vector<int> def_step(f.values.size(), -1), last_step(f.values.size(), -1);
  for (size_t s = 0; s < n; ++s) {
    const ir::Op& op = f.ops[order[s]];
    def_step[op.result] = static_cast<int>(s);
    last_step[op.result] = std::max(last_step[op.result], static_cast<int>(s));
    for (ir::ValueId v : op.operands) last_step[v] = static_cast<int>(s);
  }
  std::vector<int64_t> delta(n + 1, 0);
  for (size_t v = 0; v < f.values.size(); ++v) {
    if (weights[v] == 0 || def_step[v] < 0) continue;
    delta[def_step[v]] += weights[v];
    delta[last_step[v] + 1] -= weights[v];
  }
  Cost cost;
  cost.profile.resize(n);
  int64_t live = 0;
  for (size_t s = 0; s < n; ++s) {
    live += delta[s];
    cost.profile[s] = live;
  }
  std::sort(cost.profile.begin(), cost.profile.end(), std::greater<>());
  return cost;
}

// What the scheduler needs to know about one function.
class Scheduler {
 public:
  Scheduler(const ir::Module& m, const ir::Function& f)
      : f_(f),
        defs_(def_index(f)),
        weights_(value_weights(m, f)),
        lazy_(f.ops.size(), false),
        users_(f.ops.size()),
        is_result_(f.values.size(), false),
        readers_(f.values.size()),
        most_reads_(f.values.size(), 0) {
    for (ir::ValueId r : f.results) is_result_[r] = true;
    for (size_t i = 0; i < f.ops.size(); ++i) {
      const ir::Op& op = f.ops[i];
      bool lazy = true;
      for (ir::ValueId v : op.operands) lazy = lazy && defs_[v] >= 0 && lazy_[defs_[v]];
      lazy_[i] = lazy;
      if (!lazy) {
        regular_.push_back(static_cast<int>(i));
        for (ir::ValueId v : op.operands)
          if (defs_[v] >= 0 && !lazy_[defs_[v]]) users_[defs_[v]].push_back(static_cast<int>(i));
        for (ir::ValueId v : op.operands) {
          const int reads = static_cast<int>(std::count(op.operands.begin(), op.operands.end(), v));
          most_reads_[v] = std::max(most_reads_[v], reads);
          if (readers_[v].empty() || readers_[v].back() != static_cast<int>(i))
            readers_[v].push_back(static_cast<int>(i));
        }
      }
    }
  }

  const std::vector<int>& regular() const { return regular_; }

  // The lazy ops that op `r` needs and that are not placed yet, transitively, in the
  // current order (which is topological); marks them placed.
  std::vector<int> take_lazy_operands(int r, std::vector<bool>& placed) const {
    return take_lazy_operands(r, [&](int d) {
      if (placed[d]) return false;
      placed[d] = true;
      return true;
    });
  }
  // The same with `claim(d)`, which marks lazy op d placed and says whether it was not.
  template <class Claim>
  std::vector<int> take_lazy_operands(int r, Claim&& claim) const {
    std::vector<int> closure, stack(1, r);
    while (!stack.empty()) {
      const int i = stack.back();
      stack.pop_back();
      for (ir::ValueId v : f_.ops[i].operands) {
        const int d = defs_[v];
        if (d < 0 || !lazy_[d] || !claim(d)) continue;
        closure.push_back(d);
        stack.push_back(d);
      }
    }
    std::sort(closure.begin(), closure.end());
    return closure;
  }

  // The full order for an order of the regular ops (step 1).
  std::vector<int> expand(const std::vector<int>& seq) const {
    std::vector<bool> placed(f_.ops.size(), false);
    std::vector<int> order;
    order.reserve(f_.ops.size());
    for (int r : seq) {
      const std::vector<int> closure = take_lazy_operands(r, placed);
      order.insert(order.end(), closure.begin(), closure.end());
      order.push_back(r);
    }
    for (size_t i = 0; i < f_.ops.size(); ++i)
      if (lazy_[i] && !placed[i]) order.push_back(static_cast<int>(i));
    return order;
  }

  Cost cost_of_full(const std::vector<int>& order) const {
    return cost_of_order(f_, order, weights_);
  }

  std::vector<int> greedy() const;
  std::vector<int> refine(std::vector<int> seq) const;

 private:
  const ir::Function& f_;
  std::vector<int> defs_;
  std::vector<int64_t> weights_;
  std::vector<bool> lazy_;
  std::vector<std::vector<int>> users_;    // regular op -> regular users, once per operand
  std::vector<int> regular_;               // regular ops in the current order
  std::vector<bool> is_result_;            // by ValueId
  std::vector<std::vector<int>> readers_;  // value -> regular ops reading it, once each
  std::vector<int> most_reads_;            // value -> most times one regular op reads it

  friend class OrderState;
};

// An order of the regular ops with its expansion (see Scheduler::expand) and what the cost
// of that needs, kept up to date while refinement moves cones: each op's step, each
// value's first and last step, and the live bytes of each step. Moving a cone reorders
// one stretch of the sequence, [first, target), and so one stretch of the expansion:
// the lazy ops that the stretch needs are placed inside it, before it when an earlier op
// needs them, and the rest of the order keeps its steps. Only the values defined or read
// in the stretch change their steps, and comparing two costs (sorted profiles of the same
// length) that differ only in the stretch's steps is comparing the stretch's steps,
// sorted: the largest value that only one of them has decides either way. So a trial
// costs O(stretch log stretch), not O(n log n).
class OrderState {
 public:
  OrderState(const Scheduler& s, std::vector<int> seq)
      : s_(s),
        f_(s.f_),
        seq_(std::move(seq)),
        order_(s.expand(seq_)),
        pos_(f_.ops.size(), -1),
        step_(f_.ops.size(), -1),
        op_mark_(f_.ops.size(), 0),
        def_(f_.values.size(), -1),
        last_(f_.values.size(), -1),
        value_mark_(f_.values.size(), 0),
        new_def_(f_.values.size(), -1),
        new_last_(f_.values.size(), -1),
        live_(order_.size(), 0) {
    for (size_t p = 0; p < seq_.size(); ++p) pos_[seq_[p]] = static_cast<int>(p);
    for (size_t k = 0; k < order_.size(); ++k) {
      const int i = order_[k];
      const ir::Op& op = f_.ops[i];
      step_[i] = static_cast<int>(k);
      def_[op.result] = static_cast<int>(k);
      last_[op.result] = std::max(last_[op.result], static_cast<int>(k));
      for (ir::ValueId v : op.operands) last_[v] = static_cast<int>(k);
    }
    std::vector<int64_t> delta(order_.size() + 1, 0);
    for (size_t v = 0; v < f_.values.size(); ++v) {
      if (s_.weights_[v] == 0 || def_[v] < 0) continue;
      delta[def_[v]] += s_.weights_[v];
      delta[last_[v] + 1] -= s_.weights_[v];
    }
    int64_t live = 0;
    for (size_t k = 0; k < order_.size(); ++k) live_[k] = live += delta[k];
  }

  const std::vector<int>& sequence() const { return seq_; }
  const std::vector<int>& positions() const { return pos_; }  // by op: place in sequence()

  // Tries the sequence with the ops flagged in `in_cone` (all at positions in [first,
  // target)) moved, in their order, to just before position `target`; keeps it when its
  // cost is lower. Adds the steps looked at to `work`.
  bool try_sink(const std::vector<bool>& in_cone, int first, int target, int64_t& work) {
    stretch_.clear();
    for (int p = first; p < target; ++p)
      if (!in_cone[seq_[p]]) stretch_.push_back(seq_[p]);
    for (int p = first; p < target; ++p)
      if (in_cone[seq_[p]]) stretch_.push_back(seq_[p]);
    const int e0 = first == 0 ? 0 : step_[seq_[first - 1]] + 1;
    const int e1 = step_[seq_[target - 1]] + 1;
    const int len = e1 - e0;
    work += static_cast<int64_t>(stretch_.size()) + len;

    // The stretch's expansion: lazy ops before e0 are placed already.
    ++mark_;
    steps_.clear();
    for (int r : stretch_) {
      for (int d : s_.take_lazy_operands(r, [&](int d) {
             if (step_[d] < e0 || op_mark_[d] == mark_) return false;
             op_mark_[d] = mark_;
             return true;
           }))
        steps_.push_back(d);
      steps_.push_back(r);
    }
    KILN_ASSERT(static_cast<int>(steps_.size()) == len, "schedule: a move changed other steps");

    // The values defined or read in the stretch, with their new first and last steps.
    affected_.clear();
    auto touch = [&](ir::ValueId v) {
      if (s_.weights_[v] == 0 || def_[v] < 0) return false;
      if (value_mark_[v] != mark_) {
        value_mark_[v] = mark_;
        affected_.push_back(v);
        new_def_[v] = def_[v];
        new_last_[v] = -1;
      }
      return true;
    };
    for (int k = 0; k < len; ++k) {
      const ir::Op& op = f_.ops[steps_[k]];
      if (touch(op.result)) new_def_[op.result] = e0 + k;
      for (ir::ValueId v : op.operands)
        if (touch(v)) new_last_[v] = std::max(new_last_[v], e0 + k);
    }
    diff_.assign(static_cast<size_t>(len) + 1, 0);
    auto add = [&](int from, int to, int64_t bytes) {  // steps [from, to], within the stretch
      from = std::max(from, e0);
      to = std::min(to, e1 - 1);
      if (from > to) return;
      diff_[from - e0] += bytes;
      diff_[to - e0 + 1] -= bytes;
    };
    for (ir::ValueId v : affected_) {
      new_last_[v] = last_[v] >= e1 ? last_[v] : std::max(new_def_[v], new_last_[v]);
      add(def_[v], last_[v], -s_.weights_[v]);
      add(new_def_[v], new_last_[v], s_.weights_[v]);
    }
    new_live_.resize(len);
    int64_t change = 0;
    for (int k = 0; k < len; ++k) new_live_[k] = live_[e0 + k] + (change += diff_[k]);

    sorted_old_.assign(live_.begin() + e0, live_.begin() + e1);
    sorted_new_ = new_live_;
    std::sort(sorted_old_.begin(), sorted_old_.end(), std::greater<>());
    std::sort(sorted_new_.begin(), sorted_new_.end(), std::greater<>());
    if (!(sorted_new_ < sorted_old_)) return false;

    for (int k = 0; k < len; ++k) {
      order_[e0 + k] = steps_[k];
      step_[steps_[k]] = e0 + k;
      live_[e0 + k] = new_live_[k];
    }
    for (ir::ValueId v : affected_) {
      def_[v] = new_def_[v];
      last_[v] = new_last_[v];
    }
    for (int p = first; p < target; ++p) {
      seq_[p] = stretch_[p - first];
      pos_[seq_[p]] = p;
    }
    return true;
  }

 private:
  const Scheduler& s_;
  const ir::Function& f_;
  std::vector<int> seq_;    // the regular ops
  std::vector<int> order_;  // its expansion
  std::vector<int> pos_;    // by op: position in seq_ (-1: lazy)
  std::vector<int> step_;   // by op: position in order_
  std::vector<int> op_mark_;
  std::vector<int> def_, last_;  // by value: first and last step (-1: a parameter)
  std::vector<int> value_mark_;
  std::vector<int> new_def_, new_last_;
  std::vector<int64_t> live_;  // by step: live bytes
  int mark_ = 0;
  // Scratch of one trial.
  std::vector<int> stretch_, steps_;
  std::vector<ir::ValueId> affected_;
  std::vector<int64_t> diff_, new_live_, sorted_old_, sorted_new_;
};

// Step 2: greedy list scheduling of the regular ops. The ready ops are kept ordered by
// their cost (net growth, transient less the live bytes every candidate shares, op index),
// so each step takes the first. A ready op's cost changes only when an operand v is
// about to die in it (v's remaining reads fall to the number of times it reads v) or a
// lazy operand is placed for another op; those ready readers alone are re-costed, so the
// walk is O((n + uses * arity) log n) where a scan of every ready op per step was
// O(n * ready) (minutes for one value read by 10^4 ops).
std::vector<int> Scheduler::greedy() const {
  const size_t n = f_.ops.size();
  std::vector<int> remaining_uses(f_.values.size(), 0);
  std::vector<int> waiting(n, 0);
  for (size_t i = 0; i < n; ++i) {
    for (ir::ValueId v : f_.ops[i].operands) {
      ++remaining_uses[v];
      if (!lazy_[i] && defs_[v] >= 0 && !lazy_[defs_[v]]) ++waiting[i];
    }
  }
  std::vector<bool> placed(n, false);

  // Values whose ready readers may cost differently after this step.
  std::vector<ir::ValueId> touched;
  int64_t live = 0;
  auto place = [&](int i) {
    const ir::Op& op = f_.ops[i];
    placed[i] = true;
    if (remaining_uses[op.result] > 0) live += weights_[op.result];
    if (lazy_[i]) touched.push_back(op.result);
    for (ir::ValueId v : op.operands) {
      if (--remaining_uses[v] == 0) live -= weights_[v];
      if (remaining_uses[v] <= most_reads_[v]) touched.push_back(v);
    }
  };

  std::vector<int> stamp_of(f_.values.size(), -1);
  int stamp = 0;
  using Key = std::tuple<int64_t, int64_t, int>;  // net, transient - live, op
  auto cost = [&](int i) {
    const ir::Op& op = f_.ops[i];
    ++stamp;
    int64_t transient = weights_[op.result];
    int64_t net = remaining_uses[op.result] > 0 ? weights_[op.result] : 0;
    for (ir::ValueId v : op.operands) {
      if (stamp_of[v] == stamp) continue;
      stamp_of[v] = stamp;
      const bool dies = remaining_uses[v] ==
                        static_cast<int>(std::count(op.operands.begin(), op.operands.end(), v));
      const int d = defs_[v];
      if (d >= 0 && lazy_[d] && !placed[d]) {
        transient += weights_[v];
        if (!dies) net += weights_[v];
      } else if (dies) {
        net -= weights_[v];
      }
    }
    return Key{net, transient, i};
  };

  std::set<Key> ready;
  std::vector<Key> key_of(n);
  std::vector<bool> is_ready(n, false);
  auto make_ready = [&](int i) {
    is_ready[i] = true;
    key_of[i] = cost(i);
    ready.insert(key_of[i]);
  };
  for (int i : regular_)
    if (waiting[i] == 0) make_ready(i);

  std::vector<int> seq;
  seq.reserve(regular_.size());
  while (!ready.empty()) {
    const int r = std::get<2>(*ready.begin());
    ready.erase(ready.begin());
    is_ready[r] = false;
    // Its lazy operands first (as `expand` will place them), then the op.
    touched.clear();
    for (int d : take_lazy_operands(r, placed)) place(d);
    place(r);
    seq.push_back(r);
    for (ir::ValueId v : touched)
      for (int u : readers_[v]) {
        if (!is_ready[u]) continue;
        const Key key = cost(u);
        if (key == key_of[u]) continue;
        ready.erase(key_of[u]);
        key_of[u] = key;
        ready.insert(key);
      }
    for (int u : users_[r])
      if (--waiting[u] == 0) make_ready(u);
  }
  KILN_ASSERT(seq.size() == regular_.size(), "schedule: an op was never ready");
  return seq;
}

// Step 3: refinement by sinking cones. The cone of x is grown with a count, per producer,
// of its reads by the cone so far (exclusive when that is all its reads), and each trial
// move is costed by OrderState on the stretch it reorders only.
std::vector<int> Scheduler::refine(std::vector<int> seq) const {
  const size_t n = f_.ops.size();
  OrderState state(*this, std::move(seq));
  std::vector<bool> in_cone(n, false);
  std::vector<int> reads_in_cone(n, 0);  // regular op -> reads of its result by the cone
  std::vector<int> cone;
  const int64_t work_budget = kWorkBase + kWorkPerOp * static_cast<int64_t>(n);
  int64_t budget = work_budget;
  auto join_cone = [&](int c) {
    in_cone[c] = true;
    cone.push_back(c);
    for (ir::ValueId v : f_.ops[c].operands)
      if (defs_[v] >= 0 && !lazy_[defs_[v]]) ++reads_in_cone[defs_[v]];
  };
  for (int sweep = 0; sweep < kMaxSweeps; ++sweep) {
    bool moved = false;
    const std::vector<int> snapshot = state.sequence();
    for (auto it = snapshot.rbegin(); it != snapshot.rend() && budget > 0; ++it) {
      const int x = *it;
      const std::vector<int>& pos = state.positions();
      int target = static_cast<int>(snapshot.size());  // x's first user, or the end
      for (int u : users_[x]) target = std::min(target, pos[u]);
      if (target == pos[x] + 1) continue;
      // The cone: x and, transitively, the regular producers used only inside the cone.
      cone.clear();
      join_cone(x);
      int first = pos[x];
      int64_t work = 0;
      for (size_t k = 0; k < cone.size(); ++k) {
        for (ir::ValueId v : f_.ops[cone[k]].operands) {
          ++work;
          const int d = defs_[v];
          if (d < 0 || lazy_[d] || in_cone[d]) continue;
          if (is_result_[v] || reads_in_cone[d] != static_cast<int>(users_[d].size())) continue;
          join_cone(d);
          first = std::min(first, pos[d]);
        }
      }
      if (state.try_sink(in_cone, first, target, work)) moved = true;
      for (int c : cone) {
        in_cone[c] = false;
        for (ir::ValueId v : f_.ops[c].operands)
          if (defs_[v] >= 0) reads_in_cone[defs_[v]] = 0;
      }
      budget -= work;
    }
    if (budget <= 0)
      debug_log(kPass, "@{}: refinement stopped in sweep {}: {} steps of work done", f_.name, sweep,
                work_budget);
    if (!moved || budget <= 0) break;
  }
  debug_log(kPass, "@{}: refinement did {} steps of work", f_.name, work_budget - budget);
  return state.sequence();
}

bool schedule_function(const ir::Module& m, ir::Function& f) {
  const size_t n = f.ops.size();
  if (n == 0) return false;
  const Scheduler s(m, f);

  std::vector<int> current(n);
  for (size_t i = 0; i < n; ++i) current[i] = static_cast<int>(i);
  const int64_t original_peak = s.cost_of_full(current).peak();

  // Step 4: the candidates in order of preference; the first with the lowest peak wins.
  const std::vector<int> sequences[] = {s.regular(), s.refine(s.greedy()), s.refine(s.regular())};
  std::vector<int> order;
  int64_t peak = 0;
  std::vector<int64_t> peaks;
  for (const std::vector<int>& seq : sequences) {
    std::vector<int> candidate = s.expand(seq);
    peaks.push_back(s.cost_of_full(candidate).peak());
    if (order.empty() || peaks.back() < peak) {
      peak = peaks.back();
      order = std::move(candidate);
    }
  }
  if (peak > original_peak) {
    order = current;
    peak = original_peak;
  }
  debug_log(kPass, "@{}: peak {} bytes as given, {} with lazy ops sunk, {} greedy, {} refined: {}",
            f.name, original_peak, peaks[0], peaks[1], peaks[2], peak);
  KILN_ASSERT(order.size() == n, "schedule lost or duplicated ops");

  if (order == current) return false;
  std::vector<ir::Op> ops;
  ops.reserve(n);
  for (int i : order) ops.push_back(std::move(f.ops[i]));
  f.ops = std::move(ops);
  // A memory plan made for the old order is stale: drop it (plan-memory makes a new one).
  f.arena_bytes = -1;
  for (ir::Op& op : f.ops) op.arena_offset = -1;
  return true;
}

}  // namespace

bool schedule(ir::Module& module) {
  bool changed = false;
  for (ir::Function& f : module.functions) changed |= schedule_function(module, f);
  return changed;
}

int64_t peak_live_bytes(const ir::Module& module, const ir::Function& function) {
  std::vector<int> order(function.ops.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int>(i);
  return cost_of_order(function, order, value_weights(module, function)).peak();
}

}  // namespace kiln::passes
