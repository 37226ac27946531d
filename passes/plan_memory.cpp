// plan-memory: arena offsets for intermediates, its checker and its report.
//
// Algorithm, per function (see plan_memory.h for the contract):
//  1. Liveness over the current order: value v is live over [def(v), last(v)], the index
//     of its defining op and of its last read as lowered code reads it (def(v) when
//     unread): one reverse sweep computes when each op's kernel reads its operands (its
//     own index, or for a fused op its reader's, whose kernel computes it) and carries each
//     view's last read over to the viewed value. Arena values:
//     every op result except `weight` ops', views and the function's results.
//  2. One walk over the ops in order. At op i, first release the blocks of values with
//     last < i (their intervals cannot meet anything defined from i on). Then place the
//     result r, with its size rounded up to 64 bytes:
//       - in place: if the op is elementwise or add_layernorm and an operand v (the first
//         in operand order) is an arena value with last(v) == i and exactly r's byte size,
//         r takes over v's block (same offset);
//       - otherwise first fit: the lowest offset whose gap between the blocks still held
//         is large enough, or the end of the highest block.
//     The arena is the highest end of any block. An add_layernorm_sum's result is written
//     by its add_layernorm's kernel: it is placed (first fit) at that op, before the
//     add_layernorm's own result, while the addends are still held.
// The held blocks are a search tree on offsets that knows the largest gap below a block in
// each subtree (HeldBlocks), so first fit, holding and releasing are O(log n) and the walk
// O(n log n) (it was O(n * live blocks): seconds on a fused chain of 10^5 ops, whose values
// all live to its end). The result depends only on op order and types: the same plan on
// every run.
#include "passes/plan_memory.h"

#include <algorithm>
#include <cstdint>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "ir/printer.h"
#include "passes/rewrite.h"
#include "support/error.h"

namespace kiln::passes {
namespace {

constexpr const char* kPass = "plan-memory";
constexpr int64_t kAlignment = 64;
// The largest arena planned, 1 TiB: above it a compiled model could not allocate its
// arena on any machine it is likely to meet, so kiln compile refuses it (naming the function
// and the op that does not fit) instead of the model failing when it is created. The
// frontend refuses a config whose largest tensors exceed the same bound (frontend/nn.cpp).
constexpr int64_t kMaxArenaBytes = int64_t{1} << 40;

int64_t align_up(int64_t bytes) { return (bytes + kAlignment - 1) / kAlignment * kAlignment; }

bool may_run_in_place(ir::OpKind kind) {
  return ir::is_elementwise(kind) || kind == ir::OpKind::add_layernorm;
}

int64_t max_bytes(const ir::Module& m, const ir::TensorType& t) {
  return ir::max_numel(m, t) * ir::dtype_size(t.dtype);
}

bool is_view(ir::OpKind kind) { return kind == ir::OpKind::reshape || kind == ir::OpKind::slice; }

// The op whose kernel writes each op's result: the op itself, except for an
// add_layernorm_sum, whose sum its add_layernorm's kernel writes (so it is allocated, and
// live, from there on).
std::vector<int> write_times(const ir::Function& f) {
  const std::vector<int> defs = def_index(f);
  std::vector<int> at(f.ops.size());
  for (size_t i = 0; i < f.ops.size(); ++i) {
    const ir::Op& op = f.ops[i];
    at[i] = op.kind == ir::OpKind::add_layernorm_sum ? defs[op.operands[0]] : static_cast<int>(i);
    KILN_ASSERT(at[i] >= 0, "plan-memory: an add_layernorm_sum of no add_layernorm");
  }
  return at;
}

// Which op results take arena space: all but weights, views and the function's results.
std::vector<bool> arena_values(const ir::Function& f) {
  std::vector<bool> arena(f.values.size(), false);
  for (const ir::Op& op : f.ops)
    arena[op.result] = op.kind != ir::OpKind::weight && !is_view(op.kind);
  for (ir::ValueId r : f.results) arena[r] = false;
  return arena;
}

// The index of the op at which each value is last read once lowered (see plan_memory.h):
// a use by a view counts as late as the view's own last read, and a use by a fused op
// (Op::fused) as late as its group's kernel, which computes it. An unread value's is its
// definition; a parameter never read has -1. One reverse sweep: every user of op i's
// result comes after it, so its last read is known at i.
std::vector<int> last_reads(const ir::Function& f) {
  std::vector<int> user(f.values.size(), -1);
  for (size_t i = 0; i < f.ops.size(); ++i)
    for (ir::ValueId v : f.ops[i].operands) user[v] = static_cast<int>(i);
  std::vector<int> last(f.values.size(), -1);
  std::vector<int> read_at(f.ops.size());  // when op i's kernel reads its operands
  for (size_t k = f.ops.size(); k-- > 0;) {
    const int i = static_cast<int>(k);
    const ir::Op& op = f.ops[k];
    last[op.result] = std::max(last[op.result], i);
    // A fused op is read by one op, or is a constant or iota, which reads nothing (V12).
    read_at[k] = op.fused && user[op.result] >= 0 ? read_at[user[op.result]] : i;
    for (ir::ValueId v : op.operands)
      last[v] = std::max(last[v], is_view(op.kind) ? last[op.result] : read_at[k]);
  }
  return last;
}

// The blocks held during the walk, by offset: a treap (a binary search tree on offsets,
// a heap on fixed pseudo-random priorities) whose nodes know the gap below their block
// (its offset minus the end of the next lower block, or its offset for the lowest) and
// the largest gap in their subtree, so that first fit is one descent and holding or
// releasing a block costs O(log n) expected. Held blocks are disjoint and of nonzero size
// (a block of 0 bytes is placed at offset 0 and never held: it changes no gap). The tree's
// shape depends on the priorities, never the answers.
class HeldBlocks {
 public:
  // The offset first fit picks for `size` bytes: the end of the first block (in offset
  // order) whose gap is at least `size` below it, or the end of the highest block.
  int64_t first_fit(int64_t size) const {
    if (root_ < 0 || nodes_[root_].max_gap < size) return top_end();
    int t = root_;
    for (;;) {
      const Node& node = nodes_[t];
      if (node.left >= 0 && nodes_[node.left].max_gap >= size)
        t = node.left;
      else if (node.gap >= size)
        return node.offset - node.gap;
      else
        t = node.right;
    }
  }

  void hold(int64_t offset, int64_t size) {
    KILN_ASSERT(size > 0, "plan-memory: a held block of no bytes");
    const int id = new_node(offset, offset + size);
    int below = -1, above = -1;
    split(root_, offset, below, above);
    nodes_[id].gap = offset - end_of_highest(below);
    nodes_[id].max_gap = nodes_[id].gap;
    set_lowest_gap(above, offset + size);
    root_ = merge(merge(below, id), above);
  }

  void release(int64_t offset) {
    int below = -1, rest = -1, node = -1, above = -1;
    split(root_, offset, below, rest);
    split(rest, offset + 1, node, above);
    KILN_ASSERT(node >= 0 && nodes_[node].offset == offset && nodes_[node].left < 0 &&
                    nodes_[node].right < 0,
                "plan-memory: released a block that is not held");
    free_.push_back(node);
    set_lowest_gap(above, end_of_highest(below));
    root_ = merge(below, above);
  }

 private:
  struct Node {
    int64_t offset, end;
    int64_t gap, max_gap;
    uint32_t priority;
    int left, right;
  };

  int new_node(int64_t offset, int64_t end) {
    seed_ ^= seed_ << 13;  // xorshift32: a fixed sequence, the same on every run
    seed_ ^= seed_ >> 17;
    seed_ ^= seed_ << 5;
    const Node node{offset, end, 0, 0, seed_, -1, -1};
    if (free_.empty()) {
      nodes_.push_back(node);
      return static_cast<int>(nodes_.size()) - 1;
    }
    const int id = free_.back();
    free_.pop_back();
    nodes_[id] = node;
    return id;
  }

  void pull(int t) {
    Node& node = nodes_[t];
    node.max_gap = node.gap;
    if (node.left >= 0) node.max_gap = std::max(node.max_gap, nodes_[node.left].max_gap);
    if (node.right >= 0) node.max_gap = std::max(node.max_gap, nodes_[node.right].max_gap);
  }

  int64_t end_of_highest(int t) const {
    if (t < 0) return 0;
    while (nodes_[t].right >= 0) t = nodes_[t].right;
    return nodes_[t].end;
  }
  int64_t top_end() const { return end_of_highest(root_); }

  // Sets the gap of the lowest block of subtree t to lie above `below_end`.
  void set_lowest_gap(int t, int64_t below_end) {
    path_.clear();
    for (; t >= 0; t = nodes_[t].left) path_.push_back(t);
    if (path_.empty()) return;
    nodes_[path_.back()].gap = nodes_[path_.back()].offset - below_end;
    for (size_t k = path_.size(); k-- > 0;) pull(path_[k]);
  }

  // Splits t into the blocks below `offset` and those at or above it. The recursion is as
  // deep as the tree: O(log n) expected.
  void split(int t, int64_t offset, int& below, int& above) {
    if (t < 0) {
      below = above = -1;
      return;
    }
    if (nodes_[t].offset < offset) {
      split(nodes_[t].right, offset, nodes_[t].right, above);
      below = t;
    } else {
      split(nodes_[t].left, offset, below, nodes_[t].left);
      above = t;
    }
    pull(t);
  }

  // Joins a and b, every block of a below every block of b.
  int merge(int a, int b) {
    if (a < 0) return b;
    if (b < 0) return a;
    if (nodes_[a].priority > nodes_[b].priority) {
      nodes_[a].right = merge(nodes_[a].right, b);
      pull(a);
      return a;
    }
    nodes_[b].left = merge(a, nodes_[b].left);
    pull(b);
    return b;
  }

  std::vector<Node> nodes_;
  std::vector<int> free_;
  std::vector<int> path_;
  int root_ = -1;
  uint32_t seed_ = 2463534242u;
};

// The plan of one function: the offset of each op's result (-1 outside the arena) and the
// arena size.
struct Plan {
  std::vector<int64_t> offsets;  // by op index
  int64_t arena_bytes = 0;
};

Plan make_plan(const ir::Module& m, const ir::Function& f) {
  const std::vector<bool> arena = arena_values(f);
  const std::vector<int> last = last_reads(f);
  const std::vector<int> written = write_times(f);
  // The add_layernorm_sum op whose result the op at each position writes too (-1: none).
  std::vector<int> also_writes(f.ops.size(), -1);
  for (size_t j = 0; j < f.ops.size(); ++j)
    if (written[j] != static_cast<int>(j)) also_writes[written[j]] = static_cast<int>(j);
  Plan plan;
  plan.offsets.assign(f.ops.size(), -1);
  HeldBlocks blocks;
  // The offset of the block each value holds (-1: none) and the block's size.
  std::vector<int64_t> held(f.values.size(), -1), held_size(f.values.size(), 0);
  // The arena values that die before each op (last read at the op before): their blocks
  // are released there, unless an in-place op took the block over.
  std::vector<std::vector<ir::ValueId>> dying(f.ops.size() + 1);
  for (const ir::Op& op : f.ops)
    if (arena[op.result]) dying[last[op.result] + 1].push_back(op.result);
  // First fit for the result of the op at `i`.
  auto place = [&](size_t i) {
    const ir::Op& op = f.ops[i];
    const int64_t bytes = max_bytes(m, f.type(op.result));
    const int64_t size = align_up(bytes);
    const int64_t offset = blocks.first_fit(size);
    // Sizes are at most 2^48 bytes each (verifier V7), so this sum cannot overflow.
    if (offset + size > kMaxArenaBytes)
      fail(
          "{}function '{}': the arena would need more than {} bytes at the symbols' maxima ({} "
          "({}) of {} bytes at offset {})",
          ir::line_prefix(op.loc), f.name, kMaxArenaBytes, ir::value_names(f)[op.result],
          ir::op_name(op.kind), bytes, offset);
    if (size > 0) blocks.hold(offset, size);
    held[op.result] = offset;
    held_size[op.result] = size;
    plan.offsets[i] = offset;
    plan.arena_bytes = std::max(plan.arena_bytes, offset + size);
  };
  for (size_t i = 0; i < f.ops.size(); ++i) {
    const ir::Op& op = f.ops[i];
    for (ir::ValueId v : dying[i]) {
      if (held[v] < 0) continue;
      if (held_size[v] > 0) blocks.release(held[v]);
      held[v] = -1;
    }
    // A sum written by its add_layernorm is placed there, next to the normalized rows, while
    // the addends are still held (never in place: the kernel reads them as it writes it).
    const int sum = also_writes[i];
    if (sum >= 0 && arena[f.ops[sum].result]) place(static_cast<size_t>(sum));
    if (written[i] != static_cast<int>(i) || !arena[op.result]) continue;
    const int64_t bytes = max_bytes(m, f.type(op.result));

    ir::ValueId reuse = -1;
    if (may_run_in_place(op.kind)) {
      for (ir::ValueId v : op.operands) {
        if (!arena[v] || last[v] != static_cast<int>(i) || max_bytes(m, f.type(v)) != bytes)
          continue;
        KILN_ASSERT(held[v] >= 0, "plan-memory: a live arena value holds no block");
        reuse = v;
        break;
      }
    }
    if (reuse >= 0) {
      debug_log(kPass, "@{}: op {} ({}) runs in place over its operand at offset {}", f.name, i,
                ir::op_name(op.kind), held[reuse]);
      held[op.result] = held[reuse];
      held_size[op.result] = held_size[reuse];
      held[reuse] = -1;
      plan.offsets[i] = held[op.result];
      continue;
    }
    place(i);
  }
  return plan;
}

bool plan_function(const ir::Module& m, ir::Function& f) {
  Plan plan = make_plan(m, f);
  bool changed = f.arena_bytes != plan.arena_bytes;
  f.arena_bytes = plan.arena_bytes;
  for (size_t i = 0; i < f.ops.size(); ++i) {
    changed |= f.ops[i].arena_offset != plan.offsets[i];
    f.ops[i].arena_offset = plan.offsets[i];
  }
  return changed;
}

std::string format_bytes(int64_t bytes) {
  return fmt::format("{} bytes ({:.2f} MiB)", bytes, static_cast<double>(bytes) / (1 << 20));
}

}  // namespace

bool plan_memory(ir::Module& module) {
  bool changed = false;
  for (ir::Function& f : module.functions) changed |= plan_function(module, f);
  return changed;
}

namespace {

// The byte ranges [begin, end) (none empty) of the values live at one op, for the checker:
// which of them meet a given range. A range meets [B, E) when it starts inside it or
// contains B without starting there. The first kind are found in a set ordered by start;
// the second by stabbing a segment tree over the ranges' bounds (all known up front), each
// range stored at the O(log n) nodes that cover it exactly, removed ones dropped from a
// node's list when a query next passes it. Cost: O(log n) per range plus O(log n) per
// range found (each one an overlap to report), so the check is near-linear in a sound plan.
class LiveRanges {
 public:
  explicit LiveRanges(size_t count) : begin_(count), end_(count), live_(count, false) {}

  void add_bounds(int64_t begin, int64_t end) {
    bounds_.push_back(begin);
    bounds_.push_back(end);
  }
  void index() {
    std::sort(bounds_.begin(), bounds_.end());
    bounds_.erase(std::unique(bounds_.begin(), bounds_.end()), bounds_.end());
    cells_ = bounds_.size() > 1 ? bounds_.size() - 1 : 1;  // cell c: [bounds[c], bounds[c+1])
    size_t size = 1;
    while (size < cells_) size *= 2;
    tree_.assign(2 * size, {});
    leaves_ = size;
  }

  void insert(size_t id, int64_t begin, int64_t end) {
    begin_[id] = begin;
    end_[id] = end;
    live_[id] = true;
    by_begin_.emplace(begin, id);
    // Iterative bottom-up decomposition of the cells [cell(begin), cell(end)).
    for (size_t lo = cell(begin) + leaves_, hi = cell(end) + leaves_; lo < hi; lo /= 2, hi /= 2) {
      if (lo & 1) tree_[lo++].push_back(id);
      if (hi & 1) tree_[--hi].push_back(id);
    }
  }

  void remove(size_t id) {
    if (!live_[id]) return;
    live_[id] = false;
    by_begin_.erase({begin_[id], id});
  }

  // Appends the live ranges that meet [begin, end) (not empty) to `out`.
  void meeting(int64_t begin, int64_t end, std::vector<size_t>& out) {
    for (auto it = by_begin_.lower_bound({begin, 0}); it != by_begin_.end() && it->first < end;
         ++it)
      out.push_back(it->second);
    for (size_t node = cell(begin) + leaves_; node >= 1; node /= 2) {
      std::vector<size_t>& ids = tree_[node];
      std::erase_if(ids, [&](size_t id) { return !live_[id]; });
      for (size_t id : ids)
        if (begin_[id] < begin) out.push_back(id);  // those starting at `begin` are above
    }
  }

 private:
  size_t cell(int64_t bound) const {
    return static_cast<size_t>(std::lower_bound(bounds_.begin(), bounds_.end(), bound) -
                               bounds_.begin());
  }

  std::vector<int64_t> begin_, end_;
  std::vector<bool> live_;
  std::vector<int64_t> bounds_;
  size_t cells_ = 1, leaves_ = 1;
  std::vector<std::vector<size_t>> tree_;
  std::set<std::pair<int64_t, size_t>> by_begin_;
};

}  // namespace

// Written apart from make_plan on purpose: its own liveness (from each value's list of
// readers) and its own overlap test (a sweep over live byte ranges, no first fit), so that
// a bug in the planner is not repeated here.
std::vector<std::string> check_memory_plan(const ir::Module& module, const ir::Function& f) {
  std::vector<std::string> errors;
  const std::vector<std::string> names = ir::value_names(f);
  auto describe = [&](size_t i) {
    return fmt::format("{} (op {}, {})", names[f.ops[i].result], i, ir::op_name(f.ops[i].kind));
  };

  std::vector<bool> is_result(f.values.size(), false);
  for (ir::ValueId r : f.results) is_result[r] = true;
  // Readers of each value, once per occurrence.
  std::vector<std::vector<int>> readers(f.values.size());
  for (size_t i = 0; i < f.ops.size(); ++i)
    for (ir::ValueId v : f.ops[i].operands) readers[v].push_back(static_cast<int>(i));
  // When op u's kernel runs: a fused op's (Op::fused) is its reader's. The last op reading
  // value v's memory:
  // through its readers' kernels, and through the views (reshape, slice) of it, which share
  // its memory. Both refer only to later ops (readers come after their operands), so one
  // sweep from the last op back computes them without recursion (a chain of 10^5 fused ops
  // or views must not overflow the stack).
  std::vector<int> kernel_time(f.ops.size());
  std::vector<int> last(f.values.size(), -1);
  for (size_t k = f.ops.size(); k-- > 0;) {
    const int u = static_cast<int>(k);
    const ir::Op& op = f.ops[k];
    const std::vector<int>& r = readers[op.result];
    // A fused op with several readers (a constant or iota, V12) reads nothing itself.
    kernel_time[k] = op.fused && !r.empty() ? kernel_time[r.back()] : u;
    int last_read = u;
    for (int reader : r) {
      const ir::Op& user = f.ops[reader];
      last_read = std::max(last_read, is_view(user.kind) ? last[user.result] : kernel_time[reader]);
    }
    last[op.result] = last_read;
  }

  // When each op's result is written: an add_layernorm_sum's by its add_layernorm. Found
  // here from the operand, not with write_times, so that the check stays independent.
  std::vector<int> def_of(f.values.size(), -1);
  for (size_t i = 0; i < f.ops.size(); ++i) def_of[f.ops[i].result] = static_cast<int>(i);
  std::vector<int> write_time(f.ops.size());
  for (size_t i = 0; i < f.ops.size(); ++i) {
    const ir::Op& op = f.ops[i];
    const int producer = op.kind == ir::OpKind::add_layernorm_sum ? def_of[op.operands[0]] : -1;
    write_time[i] = producer >= 0 ? producer : static_cast<int>(i);
  }

  struct Placed {
    size_t op;           // defining op
    int64_t begin, end;  // bytes [begin, end)
  };
  std::vector<Placed> placed;
  std::vector<int64_t> offset_of(f.values.size(), -1);
  for (size_t i = 0; i < f.ops.size(); ++i) {
    const ir::Op& op = f.ops[i];
    const char* outside = is_result[op.result]            ? "function result"
                          : op.kind == ir::OpKind::weight ? "weight"
                          : is_view(op.kind)              ? "view of its operand"
                                                          : nullptr;
    if (outside) {
      if (op.arena_offset >= 0)
        errors.push_back(fmt::format("{} is a {} but has arena offset {}", describe(i), outside,
                                     op.arena_offset));
      continue;
    }
    if (op.arena_offset < 0) {
      errors.push_back(fmt::format("{} has no arena offset", describe(i)));
      continue;
    }
    const int64_t bytes = max_bytes(module, f.type(op.result));
    if (op.arena_offset % kAlignment != 0)
      errors.push_back(fmt::format("{} at offset {} is not {}-byte aligned", describe(i),
                                   op.arena_offset, kAlignment));
    // offset + bytes may not fit in 64 bits (offsets come from IR text): compare without it.
    if (f.arena_bytes < 0 || bytes > f.arena_bytes - op.arena_offset) {
      errors.push_back(fmt::format("{} at offset {} with {} bytes is outside the arena of {} bytes",
                                   describe(i), op.arena_offset, bytes, f.arena_bytes));
      continue;  // only values inside the arena are checked for overlaps
    }
    offset_of[op.result] = op.arena_offset;
    placed.push_back(Placed{i, op.arena_offset, op.arena_offset + bytes});
  }
  // In the order the values are written.
  std::stable_sort(placed.begin(), placed.end(), [&](const Placed& a, const Placed& b) {
    return write_time[a.op] < write_time[b.op];
  });

  // Two values defined at ops a < b are live together when b <= last(a). A sweep over the
  // ops keeps the values live at the current op; each value defined there is compared only
  // with the live values whose bytes meet its own (an interval stabbing structure), so a
  // sound plan is checked in O(n log n), not O(n * live values).
  std::vector<std::pair<size_t, size_t>> overlapping;  // (a, b) indices into placed
  LiveRanges live(placed.size());
  for (const Placed& p : placed) live.add_bounds(p.begin, p.end);
  live.index();
  std::vector<std::vector<size_t>> expiring(f.ops.size() + 1);  // placed, by last(value) + 1
  std::vector<size_t> met;
  size_t next = 0;
  for (size_t i = 0; i < f.ops.size(); ++i) {
    for (size_t x : expiring[i]) live.remove(x);
    for (; next < placed.size() && write_time[placed[next].op] == static_cast<int>(i); ++next) {
      const size_t y = next;
      const Placed& b = placed[y];
      if (b.begin == b.end) continue;  // no bytes: overlaps nothing
      met.clear();
      live.meeting(b.begin, b.end, met);
      for (size_t x : met) overlapping.emplace_back(x, y);
      live.insert(y, b.begin, b.end);
      expiring[std::max<int>(last[f.ops[b.op].result], static_cast<int>(i)) + 1].push_back(y);
    }
  }
  // In the order of a pairwise check: by the earlier value, then the later.
  std::sort(overlapping.begin(), overlapping.end());
  for (const auto& [x, y] : overlapping) {
    const Placed& a = placed[x];
    const Placed& b = placed[y];
    const ir::ValueId va = f.ops[a.op].result;
    const ir::Op& user = f.ops[b.op];
    const bool in_place =
        static_cast<int>(b.op) == last[va] && may_run_in_place(user.kind) && a.begin == b.begin &&
        a.end == b.end &&
        std::find(user.operands.begin(), user.operands.end(), va) != user.operands.end();
    if (in_place) continue;
    errors.push_back(fmt::format(
        "{} at [{}, {}) overlaps {} at [{}, {}) while both are live (ops {}..{})", describe(b.op),
        b.begin, b.end, describe(a.op), a.begin, a.end, b.op, last[va]));
  }
  return errors;
}

int64_t sum_of_intermediates(const ir::Module& module, const ir::Function& function) {
  const std::vector<bool> arena = arena_values(function);
  int64_t sum = 0;
  for (const ir::Op& op : function.ops)
    if (arena[op.result]) sum += max_bytes(module, function.type(op.result));
  return sum;
}

std::string memory_report(const ir::Module& module, const ir::Function& f) {
  const std::vector<int> last = last_reads(f);
  const std::vector<int> written = write_times(f);
  const std::vector<std::string> names = ir::value_names(f);
  std::vector<bool> is_result(f.values.size(), false);
  for (ir::ValueId r : f.results) is_result[r] = true;

  struct Row {
    std::string name, op, type, offset, bytes, live;
  };
  std::vector<Row> rows;
  int weights = 0;
  for (size_t i = 0; i < f.ops.size(); ++i) {
    const ir::Op& op = f.ops[i];
    if (op.kind == ir::OpKind::weight) {
      ++weights;
      continue;
    }
    std::string offset = op.arena_offset >= 0 ? std::to_string(op.arena_offset) : "-";
    if (is_result[op.result])
      offset = "result";
    else if (is_view(op.kind))
      offset = "view";
    rows.push_back(Row{names[op.result], ir::op_name(op.kind), ir::to_string(f.type(op.result)),
                       offset, std::to_string(max_bytes(module, f.type(op.result))),
                       fmt::format("[{},{}]", written[i], last[op.result])});
  }
  Row header{"value", "op", "type", "offset", "bytes", "live"};
  size_t w[5] = {header.name.size(), header.op.size(), header.type.size(), header.offset.size(),
                 header.bytes.size()};
  for (const Row& r : rows) {
    w[0] = std::max(w[0], r.name.size());
    w[1] = std::max(w[1], r.op.size());
    w[2] = std::max(w[2], r.type.size());
    w[3] = std::max(w[3], r.offset.size());
    w[4] = std::max(w[4], r.bytes.size());
  }
  std::string out = fmt::format("memory plan of @{}\n", f.name);
  auto line = [&](const Row& r) {
    out += fmt::format("  {:<{}}  {:<{}}  {:<{}}  {:>{}}  {:>{}}  {}\n", r.name, w[0], r.op, w[1],
                       r.type, w[2], r.offset, w[3], r.bytes, w[4], r.live);
  };
  line(header);
  for (const Row& r : rows) line(r);
  if (weights > 0)
    out += fmt::format("  ({} weight op{}, not in the arena)\n", weights, weights == 1 ? "" : "s");

  const int64_t sum = sum_of_intermediates(module, f);
  if (f.arena_bytes < 0) {
    out += fmt::format("no memory plan (run plan-memory); sum of intermediates: {}\n",
                       format_bytes(sum));
    return out;
  }
  std::string factor = f.arena_bytes > 0
                           ? fmt::format("{:.2f}", static_cast<double>(sum) / f.arena_bytes)
                           : std::string("-");
  out += fmt::format("arena peak: {}; sum of intermediates: {}; reuse factor {}\n",
                     format_bytes(f.arena_bytes), format_bytes(sum), factor);
  return out;
}

}  // namespace kiln::passes
