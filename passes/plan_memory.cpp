// plan-memory: arena offsets for intermediates, its checker and its report.
//
// Algorithm, per function (see plan_memory.h for the contract):
//  1. Liveness over the current order: value v is live over [def(v), last(v)], the index
//     of its defining op and of its last read as lowered code reads it (def(v) when
//     unread): one reverse sweep computes when each op's kernel reads its operands (its
//     own index, or its single elementwise reader's when it may be computed inside that
//     kernel) and carries each view's last read over to the viewed value. Arena values:
//     every op result except `weight` ops', views and the function's results.
//  2. One walk over the ops in order. At op i, first release the blocks of values with
//     last < i (their intervals cannot meet anything defined from i on). Then place the
//     result r, with its size rounded up to 64 bytes:
//       - in place: if the op is elementwise or add_layernorm and an operand v (the first
//         in operand order) is an arena value with last(v) == i and exactly r's byte size,
//         r takes over v's block (same offset);
//       - otherwise first fit: the lowest offset whose gap between the blocks still held
//         is large enough, or the end of the highest block.
//     The arena is the highest end of any block.
// Blocks are kept in a vector sorted by offset, so the walk is O(n * live blocks) and the
// result depends only on op order and types: the same plan on every run.
#include "passes/plan_memory.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "ir/printer.h"
#include "passes/rewrite.h"
#include "support/error.h"

namespace kiln::passes {
namespace {

constexpr const char* kPass = "plan-memory";
constexpr int64_t kAlignment = 64;
// The largest arena planned: that of one tensor at its largest (verifier V7).
constexpr int64_t kMaxArenaBytes = int64_t{1} << 48;

int64_t align_up(int64_t bytes) { return (bytes + kAlignment - 1) / kAlignment * kAlignment; }

bool may_run_in_place(ir::OpKind kind) {
  return ir::is_elementwise(kind) || kind == ir::OpKind::add_layernorm;
}

int64_t max_bytes(const ir::Module& m, const ir::TensorType& t) {
  return ir::max_numel(m, t) * ir::dtype_size(t.dtype);
}

bool is_view(ir::OpKind kind) { return kind == ir::OpKind::reshape || kind == ir::OpKind::slice; }

bool is_pointwise(ir::OpKind kind) {
  return ir::is_elementwise(kind) || kind == ir::OpKind::gather || kind == ir::OpKind::constant ||
         kind == ir::OpKind::iota;
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
// a use by a view counts as late as the view's own last read, and a use by a pointwise op
// that may be computed inside its single elementwise user as late as that user's read.
// An unread value's is its definition; a parameter never read has -1. One reverse sweep:
// every user of op i's result comes after it, so its last read is known at i.
std::vector<int> last_reads(const ir::Function& f) {
  std::vector<int> uses(f.values.size(), 0), user(f.values.size(), -1);
  for (size_t i = 0; i < f.ops.size(); ++i)
    for (ir::ValueId v : f.ops[i].operands) {
      ++uses[v];
      user[v] = static_cast<int>(i);
    }
  for (ir::ValueId r : f.results) uses[r] += 2;  // a result is never computed inside a user
  std::vector<int> last(f.values.size(), -1);
  std::vector<int> read_at(f.ops.size());  // when op i's kernel reads its operands
  for (size_t k = f.ops.size(); k-- > 0;) {
    const int i = static_cast<int>(k);
    const ir::Op& op = f.ops[k];
    last[op.result] = std::max(last[op.result], i);
    const bool fused = is_pointwise(op.kind) && uses[op.result] == 1 &&
                       ir::is_elementwise(f.ops[user[op.result]].kind);
    read_at[k] = fused ? read_at[user[op.result]] : i;
    for (ir::ValueId v : op.operands)
      last[v] = std::max(last[v], is_view(op.kind) ? last[op.result] : read_at[k]);
  }
  return last;
}

struct Block {
  int64_t offset;
  int64_t size;
  ir::ValueId value;
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
  Plan plan;
  plan.offsets.assign(f.ops.size(), -1);
  std::vector<Block> blocks;  // held blocks, sorted by offset
  // How many held blocks die before each op: the walk releases blocks only where some do.
  std::vector<int> dying(f.ops.size() + 1, 0);
  for (const ir::Op& op : f.ops)
    if (arena[op.result]) ++dying[last[op.result] + 1];
  for (size_t i = 0; i < f.ops.size(); ++i) {
    const ir::Op& op = f.ops[i];
    if (dying[i] > 0)
      std::erase_if(blocks, [&](const Block& b) { return last[b.value] < static_cast<int>(i); });
    if (!arena[op.result]) continue;
    const int64_t bytes = max_bytes(m, f.type(op.result));
    const int64_t size = align_up(bytes);

    Block* reuse = nullptr;
    if (may_run_in_place(op.kind)) {
      for (ir::ValueId v : op.operands) {
        if (!arena[v] || last[v] != static_cast<int>(i) || max_bytes(m, f.type(v)) != bytes)
          continue;
        auto it = std::find_if(blocks.begin(), blocks.end(),
                               [&](const Block& b) { return b.value == v; });
        KILN_ASSERT(it != blocks.end(), "plan-memory: a live arena value holds no block");
        reuse = &*it;
        break;
      }
    }
    if (reuse) {
      debug_log(kPass, "@{}: op {} ({}) runs in place over its operand at offset {}", f.name, i,
                ir::op_name(op.kind), reuse->offset);
      reuse->value = op.result;
      plan.offsets[i] = reuse->offset;
      continue;
    }
    int64_t offset = 0;
    auto pos = blocks.begin();
    for (; pos != blocks.end(); ++pos) {
      if (pos->offset - offset >= size) break;
      offset = std::max(offset, pos->offset + pos->size);
    }
    // Sizes are at most 2^48 bytes each (verifier V7), so this sum cannot overflow.
    if (offset + size > kMaxArenaBytes)
      fail(
          "{}function '{}': the arena would need more than {} bytes at the symbols' maxima ({} "
          "({}) of {} bytes at offset {})",
          ir::line_prefix(op.loc), f.name, kMaxArenaBytes, ir::value_names(f)[op.result],
          ir::op_name(op.kind), bytes, offset);
    blocks.insert(pos, Block{offset, size, op.result});
    plan.offsets[i] = offset;
    plan.arena_bytes = std::max(plan.arena_bytes, offset + size);
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

// Written apart from make_plan on purpose: its own liveness (from each value's list of
// readers) and a pairwise overlap test, so that a bug in the planner is not repeated here.
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
  // When op u's kernel runs: a pointwise op read once, by an elementwise op, and not
  // returned may run inside that reader's kernel. The last op reading value v's memory:
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
    const bool fused = is_pointwise(op.kind) && !is_result[op.result] && r.size() == 1 &&
                       ir::is_elementwise(f.ops[r[0]].kind);
    kernel_time[k] = fused ? kernel_time[r[0]] : u;
    int last_read = u;
    for (int reader : r) {
      const ir::Op& user = f.ops[reader];
      last_read = std::max(last_read, is_view(user.kind) ? last[user.result] : kernel_time[reader]);
    }
    last[op.result] = last_read;
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

  // Two values defined at ops a < b are live together when b <= last(a).
  for (size_t x = 0; x < placed.size(); ++x) {
    const Placed& a = placed[x];
    const ir::ValueId va = f.ops[a.op].result;
    for (size_t y = x + 1; y < placed.size(); ++y) {
      const Placed& b = placed[y];
      if (static_cast<int>(b.op) > last[va]) break;  // placed is in op order
      if (a.begin >= b.end || b.begin >= a.end || a.begin == a.end || b.begin == b.end) continue;
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
                       fmt::format("[{},{}]", i, last[op.result])});
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
