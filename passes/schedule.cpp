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
// Cost: O(n * ready) for the greedy walk and O(n log n + uses) per evaluated order, so
// O(n^2 log n) per refinement sweep (about 50 ms for the unfused base Transformer). Op
// positions are recomputed only after a kept move, and refinement stops after
// kTrialBudget trial steps, so a graph of 10^5 ops is scheduled in seconds. Only op
// indices and positions decide anything, so the result is the same on every run.
#include "passes/schedule.h"

#include <algorithm>
#include <cstdint>
#include <functional>
#include <tuple>
#include <vector>

#include "passes/rewrite.h"
#include "support/error.h"

namespace kiln::passes {
namespace {

constexpr const char* kPass = "schedule";
constexpr int kMaxSweeps = 4;
// The most trial steps (ops of trial orders evaluated) refinement spends on one order: its
// cost is O(trials * n log n), so without a bound a graph of 10^5 ops takes hours. The
// base Transformer (unfused, ~3000 ops) needs a few million.
constexpr int64_t kTrialBudget = int64_t{1} << 26;

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
        users_(f.ops.size()) {
    for (size_t i = 0; i < f.ops.size(); ++i) {
      const ir::Op& op = f.ops[i];
      bool lazy = true;
      for (ir::ValueId v : op.operands) lazy = lazy && defs_[v] >= 0 && lazy_[defs_[v]];
      lazy_[i] = lazy;
      if (!lazy) {
        regular_.push_back(static_cast<int>(i));
        for (ir::ValueId v : op.operands)
          if (defs_[v] >= 0 && !lazy_[defs_[v]]) users_[defs_[v]].push_back(static_cast<int>(i));
      }
    }
  }

  const std::vector<int>& regular() const { return regular_; }

  // The lazy ops that op `r` needs and that are not placed yet, transitively, in the
  // current order (which is topological); marks them placed.
  std::vector<int> take_lazy_operands(int r, std::vector<bool>& placed) const {
    std::vector<int> closure, stack(1, r);
    while (!stack.empty()) {
      const int i = stack.back();
      stack.pop_back();
      for (ir::ValueId v : f_.ops[i].operands) {
        const int d = defs_[v];
        if (d < 0 || !lazy_[d] || placed[d]) continue;
        placed[d] = true;
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

  Cost cost(const std::vector<int>& seq) const { return cost_of_order(f_, expand(seq), weights_); }
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
  std::vector<std::vector<int>> users_;  // regular op -> regular users, once per operand
  std::vector<int> regular_;             // regular ops in the current order
};

// Step 2: greedy list scheduling of the regular ops.
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
  std::vector<int> ready;  // sorted by op index (= current position)
  for (int i : regular_)
    if (waiting[i] == 0) ready.push_back(i);

  int64_t live = 0;
  auto place = [&](int i) {
    const ir::Op& op = f_.ops[i];
    placed[i] = true;
    if (remaining_uses[op.result] > 0) live += weights_[op.result];
    for (ir::ValueId v : op.operands)
      if (--remaining_uses[v] == 0) live -= weights_[v];
  };

  std::vector<int> stamp_of(f_.values.size(), -1);
  int stamp = 0;
  auto cost = [&](int i) {
    const ir::Op& op = f_.ops[i];
    ++stamp;
    int64_t transient = live + weights_[op.result];
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
    return std::make_tuple(net, transient, i);
  };

  std::vector<int> seq;
  seq.reserve(regular_.size());
  while (!ready.empty()) {
    size_t best = 0;
    auto best_cost = cost(ready[0]);
    for (size_t k = 1; k < ready.size(); ++k) {
      auto c = cost(ready[k]);
      if (c < best_cost) {
        best_cost = c;
        best = k;
      }
    }
    const int r = ready[best];
    ready.erase(ready.begin() + static_cast<std::ptrdiff_t>(best));
    // Its lazy operands first (as `expand` will place them), then the op.
    for (int d : take_lazy_operands(r, placed)) place(d);
    place(r);
    seq.push_back(r);
    for (int u : users_[r])
      if (--waiting[u] == 0) ready.insert(std::lower_bound(ready.begin(), ready.end(), u), u);
  }
  KILN_ASSERT(seq.size() == regular_.size(), "schedule: an op was never ready");
  return seq;
}

// Step 3: refinement by sinking cones.
std::vector<int> Scheduler::refine(std::vector<int> seq) const {
  const size_t n = f_.ops.size();
  Cost best = cost(seq);
  std::vector<int> pos(n, -1);
  std::vector<bool> in_cone(n, false);
  std::vector<int> cone;
  int64_t budget = kTrialBudget;
  for (int sweep = 0; sweep < kMaxSweeps; ++sweep) {
    bool moved = false;
    const std::vector<int> snapshot = seq;
    bool stale = true;  // pos is recomputed only after seq changed
    for (auto it = snapshot.rbegin(); it != snapshot.rend() && budget > 0; ++it) {
      const int x = *it;
      if (stale)
        for (size_t p = 0; p < seq.size(); ++p) pos[seq[p]] = static_cast<int>(p);
      stale = false;
      int target = static_cast<int>(seq.size());  // x's first user, or the end
      for (int u : users_[x]) target = std::min(target, pos[u]);
      if (target == pos[x] + 1) continue;
      // The cone: x and, transitively, the regular producers used only inside the cone.
      cone.assign(1, x);
      in_cone[x] = true;
      for (size_t k = 0; k < cone.size(); ++k) {
        for (ir::ValueId v : f_.ops[cone[k]].operands) {
          const int d = defs_[v];
          if (d < 0 || lazy_[d] || in_cone[d]) continue;
          bool exclusive = true;
          for (int u : users_[d]) exclusive = exclusive && in_cone[u];
          for (ir::ValueId r : f_.results) exclusive = exclusive && r != v;
          if (!exclusive) continue;
          in_cone[d] = true;
          cone.push_back(d);
        }
      }
      std::vector<int> trial;
      trial.reserve(seq.size());
      for (int p = 0; p < target; ++p)
        if (!in_cone[seq[p]]) trial.push_back(seq[p]);
      for (int p = 0; p < target; ++p)
        if (in_cone[seq[p]]) trial.push_back(seq[p]);
      trial.insert(trial.end(), seq.begin() + target, seq.end());
      for (int c : cone) in_cone[c] = false;
      budget -= static_cast<int64_t>(trial.size());
      const Cost c = cost(trial);
      if (c < best) {
        seq = std::move(trial);
        best = c;
        moved = stale = true;
      }
    }
    if (budget <= 0)
      debug_log(kPass, "@{}: refinement stopped in sweep {}: {} trial steps evaluated", f_.name,
                sweep, kTrialBudget);
    if (!moved || budget <= 0) break;
  }
  return seq;
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
