// Serialization and validation of execution plans (see plan.h).
#include "runtime/plan.h"

#include <sys/mman.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "support/error.h"
#include "support/int8.h"

namespace kiln::rt {

DimExpr DimExpr::symbol(int index, int64_t coeff) {
  DimExpr d{coeff, std::vector<int8_t>(index + 1, 0)};
  d.pows[index] = 1;
  return d;
}

int64_t DimExpr::eval(const std::vector<int64_t>& symbols) const {
  int64_t v = coeff;
  for (size_t i = 0; i < pows.size(); ++i)
    for (int p = 0; p < pows[i]; ++p) v *= symbols.at(i);
  return v;
}

DimExpr DimExpr::operator*(const DimExpr& o) const {
  DimExpr r{coeff * o.coeff, pows};
  if (o.pows.size() > r.pows.size()) r.pows.resize(o.pows.size(), 0);
  for (size_t i = 0; i < o.pows.size(); ++i) r.pows[i] = static_cast<int8_t>(r.pows[i] + o.pows[i]);
  return r;
}

bool DimExpr::operator==(const DimExpr& o) const {
  if (coeff != o.coeff) return false;
  size_t n = std::max(pows.size(), o.pows.size());
  for (size_t i = 0; i < n; ++i) {
    int a = i < pows.size() ? pows[i] : 0, b = i < o.pows.size() ? o.pows[i] : 0;
    if (a != b) return false;
  }
  return true;
}

bool DimExpr::is_constant() const {
  for (int8_t p : pows)
    if (p) return false;
  return true;
}

int DimExpr::single_symbol() const {
  if (coeff != 1) return -1;
  int found = -1;
  for (size_t i = 0; i < pows.size(); ++i) {
    if (pows[i] == 0) continue;
    if (pows[i] != 1 || found >= 0) return -1;
    found = static_cast<int>(i);
  }
  return found;
}

int DimExpr::scaled_symbol() const {
  if (coeff < 1) return -1;
  DimExpr unit = *this;
  unit.coeff = 1;
  return unit.single_symbol();
}

std::string dim_text(const DimExpr& d, const Plan& plan) {
  const int s = d.scaled_symbol();
  if (s < 0 || s >= static_cast<int>(plan.symbols.size())) return std::to_string(d.coeff);
  const std::string& name = plan.symbols[static_cast<size_t>(s)].name;
  if (d.coeff == 1) return name;
  if (plan.symbols[static_cast<size_t>(s)].base < 0) return std::to_string(d.coeff) + "*" + name;
  return std::to_string(d.coeff) + "*(" + name + ")";
}

namespace {

// Version 6: kiln_hooks gained release_device (a library built for 5 passes a shorter struct).
// Version 7: kiln_hooks gained device (the device memory operations of a GPU library).
// Version 8: kiln_hooks gained set_custom_do_par_for (the runtime's thread pool).
// Version 10 ('A'): steps list the kernels a builtin calls (moe_ffn's linear kernels).
// Version 11 ('B'): symbols derived from others (base, scale, offset: T+1).
// Version 12 ('C'): int8 weights (a weight's storage f32 0, bf16 1, int8 2), and the element
// types i8 and i32 (the int8 kernels' weights and row sums).
// Version 13 ('D'): a linear weight's transpose 2: its one source is stored [K, N]
// (WeightDesc::source_kn), transposed at load time into any layout.
// Version 14 ('E'): Plan::fma_functions (a bf16 library's second form of its products).
// Version 15 ('F'): kiln_hooks gained set_custom_malloc and set_custom_free (the kernels'
// scratch memory, runtime/kernel_memory.h).
constexpr char kMagic[8] = {'K', 'I', 'L', 'N', 'P', 'L', 'N', 'F'};

// A plan stores an element type as its index here: the codes of format 8 (f32 0, i64 1,
// bool 2, bf16 3), kept when the runtime's element types became kiln_dtype, so a plan's
// bytes did not change; then i8 4 and i32 5 (format 12).
constexpr kiln_dtype kPlanTypes[] = {KILN_F32, KILN_I64, KILN_BOOL, KILN_BF16, KILN_I8, KILN_I32};
constexpr int64_t kPlanTypeCount = sizeof kPlanTypes / sizeof kPlanTypes[0];

int64_t type_code(kiln_dtype type) {
  for (int64_t i = 0; i < kPlanTypeCount; ++i)
    if (kPlanTypes[i] == type) return i;
  KILN_ASSERT(false, fmt::format("a plan holds no element type {}", static_cast<int>(type)));
  return 0;
}

class Writer {
 public:
  void i64(int64_t v) {
    uint8_t b[8];
    std::memcpy(b, &v, 8);
    out.insert(out.end(), b, b + 8);
  }
  void str(const std::string& s) {
    i64(static_cast<int64_t>(s.size()));
    out.insert(out.end(), s.begin(), s.end());
  }
  void dim(const DimExpr& d) {
    i64(d.coeff);
    i64(static_cast<int64_t>(d.pows.size()));
    for (int8_t p : d.pows) i64(p);
  }
  void dims(const std::vector<DimExpr>& ds) {
    i64(static_cast<int64_t>(ds.size()));
    for (const DimExpr& d : ds) dim(d);
  }
  void ints(const std::vector<int64_t>& v) {
    i64(static_cast<int64_t>(v.size()));
    for (int64_t x : v) i64(x);
  }
  void tensor(const TensorDesc& t) {
    str(t.name);
    i64(type_code(t.type));
    dims(t.shape);
    i64(static_cast<int64_t>(t.id_limits.size()));
    for (const auto& l : t.id_limits) {
      dim(l.limit);
      str(l.what);
      i64(l.lowest);
    }
    i64(t.updates_param);
  }
  std::vector<uint8_t> out;
};

class Reader {
 public:
  Reader(const uint8_t* d, size_t n) : data_(d), size_(n) {}
  int64_t i64() {
    if (size_ - pos_ < 8) fail("compiled plan is truncated at byte {}", pos_);
    int64_t v;
    std::memcpy(&v, data_ + pos_, 8);
    pos_ += 8;
    return v;
  }
  int64_t count(int64_t max = 1 << 24) {
    int64_t n = i64();
    if (n < 0 || n > max) fail("compiled plan has a bad count {} at byte {}", n, pos_ - 8);
    return n;
  }
  std::string str() {
    int64_t n = count();
    if (static_cast<size_t>(n) > size_ - pos_) fail("compiled plan is truncated at byte {}", pos_);
    std::string s(reinterpret_cast<const char*>(data_ + pos_), n);
    pos_ += n;
    return s;
  }
  DimExpr dim() {
    DimExpr d;
    d.coeff = i64();
    d.pows.resize(count(64));
    for (int8_t& p : d.pows) p = static_cast<int8_t>(i64());
    return d;
  }
  std::vector<DimExpr> dims() {
    std::vector<DimExpr> v(count(16));
    for (DimExpr& d : v) d = dim();
    return v;
  }
  std::vector<int64_t> ints() {
    std::vector<int64_t> v(count(16));
    for (int64_t& x : v) x = i64();
    return v;
  }
  TensorDesc tensor() {
    TensorDesc t;
    t.name = str();
    t.type = elem(i64());
    t.shape = dims();
    t.id_limits.resize(count(16));
    for (auto& l : t.id_limits) {
      l.limit = dim();
      l.what = str();
      l.lowest = i64();
      if (l.lowest != 0 && l.lowest != -1) fail("compiled plan has an id limit from {}", l.lowest);
    }
    t.updates_param = static_cast<int32_t>(i64());
    return t;
  }
  kiln_dtype elem(int64_t v) {
    if (v < 0 || v >= kPlanTypeCount) fail("compiled plan has an unknown element type {}", v);
    return kPlanTypes[v];
  }
  bool done() const { return pos_ == size_; }
  void bytes(const char* want, size_t n) {
    if (size_ - pos_ < n || std::memcmp(data_ + pos_, want, n) != 0)
      fail("not a kiln plan (bad magic or version)");
    pos_ += n;
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

void validate(const Plan& p) {
  for (const WeightDesc& w : p.weights) {
    const bool packed_shape =
        w.bf16   ? w.shape.size() == 4 && w.shape[2] == 64 && w.shape[3] == 2 && w.panel == 64
        : w.int8 ? w.shape.size() == 4 && w.shape[2] == 64 && w.shape[3] == 4 && w.panel == 64
                 : w.shape.size() == 3 && w.shape[2] == w.panel;
    if (w.panel < 0 || (w.bf16 && w.int8) || (w.panel > 0 && (!w.transpose || !packed_shape)) ||
        (w.panel == 0 && (w.bf16 || w.int8 || (w.transpose && w.shape.size() != 2))))
      fail("compiled plan: weight '{}' has a bad layout (panel {}, shape [{}])", w.name, w.panel,
           fmt::join(w.shape, ","));
  }
  const int64_t nsym = static_cast<int64_t>(p.symbols.size());
  auto check_dim = [&](const DimExpr& d) {
    if (static_cast<int64_t>(d.pows.size()) > nsym)
      fail("compiled plan: dim refers to a missing symbol");
    for (int8_t pw : d.pows)
      if (pw < 0 || pw > 4) fail("compiled plan: bad symbol power {}", pw);
  };
  if (!p.fma_functions.empty()) {
    bool same = p.fma_functions.size() == p.functions.size();
    for (size_t i = 0; same && i < p.functions.size(); ++i) {
      const FunctionDesc &a = p.functions[i], &b = p.fma_functions[i];
      auto same_tensors = [](const std::vector<TensorDesc>& x, const std::vector<TensorDesc>& y) {
        if (x.size() != y.size()) return false;
        for (size_t t = 0; t < x.size(); ++t)
          if (x[t].name != y[t].name || x[t].type != y[t].type || !(x[t].shape == y[t].shape) ||
              x[t].updates_param != y[t].updates_param)
            return false;
        return true;
      };
      same = a.name == b.name && same_tensors(a.params, b.params) &&
             same_tensors(a.results, b.results);
    }
    if (!same)
      fail("compiled plan: its FMA form of the bf16 entry points does not match the entry points");
  }
  for (const auto* functions : {&p.functions, &p.fma_functions})
    for (const FunctionDesc& f : *functions) {
      for (const auto* list : {&f.params, &f.results})
        for (const TensorDesc& t : *list) {
          if (t.type == KILN_BF16 || t.type == KILN_I8 || t.type == KILN_I32)
            fail("compiled plan: tensor '{}' of '{}' is {} (only weights are)", t.name, f.name,
                 ::kiln::dtype_name(t.type));
          for (const DimExpr& d : t.shape) check_dim(d);
          for (const auto& l : t.id_limits) check_dim(l.limit);
        }
      for (const TensorDesc& t : f.results) {
        if (t.updates_param < -1 || t.updates_param >= static_cast<int32_t>(f.params.size()))
          fail("compiled plan: result '{}' updates missing parameter {}", t.name, t.updates_param);
        if (t.updates_param >= 0 && (f.params[t.updates_param].type != t.type ||
                                     f.params[t.updates_param].shape.size() != t.shape.size()))
          fail("compiled plan: result '{}' does not match the parameter it updates", t.name);
      }
      for (const DimCheck& c : f.checks) {
        check_dim(c.lhs);
        check_dim(c.rhs);
      }
      for (const StepDesc& s : f.steps) {
        if (s.builtin != Builtin::moe_ffn && !s.calls.empty())
          fail("compiled plan: step '{}' lists kernels it does not call", s.op);
        if (s.builtin == Builtin::cache_write) {
          const size_t n = s.args.size();
          if (s.kernel != -1 || (n != 2 && n != 3) || s.args[0].extents.size() != 3 ||
              (n == 3 && (s.args[1].extents.size() != 1 || s.args[1].type != KILN_I64)) ||
              s.args[n - 1].extents.size() != 3 || s.args[0].type != KILN_F32 ||
              s.args[n - 1].type != KILN_F32)
            fail("compiled plan: cache_write step '{}' has bad arguments", s.op);
        } else if (s.builtin == Builtin::moe_ffn) {
          const size_t n = s.args.size();
          bool ok = s.kernel == -1 && n >= 7 && (n - 4) % 3 == 0 && s.calls.size() == 3;
          for (size_t a = 0; ok && a < n; ++a) {
            const bool weight = a >= 3 && a + 1 < n;
            ok = (weight || s.args[a].extents.size() == 2) &&
                 s.args[a].type == (a == 1 ? KILN_I64 : KILN_F32);
          }
          for (int32_t k : s.calls)
            ok = ok && k >= 0 && k < static_cast<int32_t>(p.kernel_names.size());
          if (!ok) fail("compiled plan: moe_ffn step '{}' has bad arguments", s.op);
        } else if (s.kernel < 0 || s.kernel >= static_cast<int32_t>(p.kernel_names.size())) {
          fail("compiled plan: step '{}' calls missing kernel {}", s.op, s.kernel);
        }
        for (const BufferDesc& b : s.args) {
          if (b.extents.size() != b.strides.size() || b.extents.empty() && !b.strides.empty())
            fail("compiled plan: step '{}' has a buffer with mismatched rank", s.op);
          int64_t limit = 0;
          switch (b.storage) {
            case Storage::param:
              limit = static_cast<int64_t>(f.params.size());
              break;
            case Storage::result:
              limit = static_cast<int64_t>(f.results.size());
              break;
            case Storage::arena:
              limit = 1;
              break;
            case Storage::weight:
              limit = static_cast<int64_t>(p.weights.size());
              break;
            case Storage::table:
              limit = static_cast<int64_t>(p.tables.size());
              break;
          }
          if (b.index < 0 || b.index >= limit)
            fail("compiled plan: step '{}' refers to missing storage {}", s.op, b.index);
          if (b.byte_offset < 0 || (b.storage == Storage::arena && b.byte_offset > f.arena_bytes))
            fail("compiled plan: step '{}' has a bad byte offset {}", s.op, b.byte_offset);
          check_dim(b.elem_offset);
          for (const DimExpr& d : b.extents) check_dim(d);
          for (const DimExpr& d : b.strides) check_dim(d);
        }
      }
    }
}

}  // namespace

uint16_t f32_to_bf16(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);
  // Zero and subnormals (exponent 0) become a zero of their sign, as AVX512-BF16 converts
  // them (vcvtne2ps2bf16) and reads bf16 subnormals (vdpbf16ps): the kernels never see one.
  if ((bits & 0x7f800000u) == 0) return static_cast<uint16_t>((bits >> 16) & 0x8000u);
  return static_cast<uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

float bf16_to_f32(uint16_t bits) {
  const uint32_t wide = static_cast<uint32_t>(bits) << 16;
  float x;
  std::memcpy(&x, &wide, 4);
  return x;
}

namespace {
// Element k of a little-endian row of f32 (or bf16) values, as f32.
inline float source_value(const uint8_t* row, int64_t k, bool bf16) {
  if (bf16) {
    uint16_t b;
    std::memcpy(&b, row + k * 2, 2);
    return bf16_to_f32(b);
  }
  float v;
  std::memcpy(&v, row + k * 4, 4);
  return v;
}
}  // namespace

void lay_out_linear_weight_rows(const uint8_t* w_rows, int64_t n0, int64_t rows, int64_t N,
                                int64_t K, int64_t panel, float* wt, bool source_bf16) {
  KILN_ASSERT(panel >= 0 && (panel == 0 || N % panel == 0), "panel width must divide N");
  KILN_ASSERT(n0 >= 0 && rows >= 0 && n0 + rows <= N, "rows outside the weight");
  const int64_t stride = panel ? panel : N;
  const int64_t bytes = source_bf16 ? 2 : 4;
  for (int64_t n = n0; n < n0 + rows; ++n) {
    float* column = panel ? wt + (n / panel) * K * panel + n % panel : wt + n;
    const uint8_t* row = w_rows + (n - n0) * K * bytes;
    for (int64_t k = 0; k < K; ++k) column[k * stride] = source_value(row, k, source_bf16);
  }
}

void lay_out_linear_weight_bf16_rows(const uint8_t* w_rows, int64_t n0, int64_t rows, int64_t N,
                                     int64_t K, uint16_t* wt, bool source_bf16) {
  KILN_ASSERT(n0 >= 0 && rows >= 0 && n0 + rows <= N, "rows outside the weight");
  const int64_t bytes = source_bf16 ? 2 : 4, Kp = K + K % 2;
  for (int64_t n = n0; n < n0 + rows; ++n) {
    uint16_t* column = wt + (n / 64) * Kp * 64 + (n % 64) * 2;
    const uint8_t* row = w_rows + (n - n0) * K * bytes;
    for (int64_t k = 0; k < K; ++k)
      column[(k / 2) * 128 + k % 2] = f32_to_bf16(source_value(row, k, source_bf16));
  }
}

int64_t lay_out_linear_weight_int8_rows(const uint8_t* w_rows, int64_t n0, int64_t rows, int64_t N,
                                        int64_t K, uint8_t* out, bool source_bf16) {
  KILN_ASSERT(n0 >= 0 && rows >= 0 && n0 + rows <= N, "rows outside the weight");
  const int64_t bytes = source_bf16 ? 2 : 4, Kp = (K + 3) / 4 * 4, Np = (N + 63) / 64 * 64;
  std::vector<float> row(static_cast<size_t>(K));
  for (int64_t n = n0; n < n0 + rows; ++n) {
    const uint8_t* src = w_rows + (n - n0) * K * bytes;
    for (int64_t k = 0; k < K; ++k) {
      row[static_cast<size_t>(k)] = source_value(src, k, source_bf16);
      if (!std::isfinite(row[static_cast<size_t>(k)])) return n;
    }
    const float absmax = int8::absmax(row.data(), K), inverse = int8::inverse_scale(absmax);
    int8_t* column = reinterpret_cast<int8_t*>(out) + (n / 64) * Kp * 64 + (n % 64) * 4;
    int32_t sum = 0;
    for (int64_t k = 0; k < K; ++k) {
      const int8_t q = int8::quantize(row[static_cast<size_t>(k)], inverse);
      column[(k / 4) * 256 + k % 4] = q;
      sum += q;
    }
    const float scale = int8::scale(absmax);
    std::memcpy(out + Np * Kp + 4 * n, &scale, 4);
    std::memcpy(out + Np * Kp + 4 * Np + 4 * n, &sum, 4);
  }
  return -1;
}

int64_t weight_bytes(const WeightDesc& w) {
  int64_t numel = 1;
  for (int64_t d : w.shape) numel *= d;
  if (w.int8) return numel + 8 * w.shape.at(0) * 64;
  return numel * (w.bf16 ? 2 : 4);
}

AlignedStorage allocate_aligned(int64_t bytes) {
  constexpr int64_t kHuge = int64_t{2} << 20;
  const int64_t align = bytes >= kHuge ? kHuge : 64;
  const int64_t rounded = std::max<int64_t>(64, (bytes + align - 1) / align * align);
  AlignedStorage data(static_cast<uint8_t*>(
      std::aligned_alloc(static_cast<size_t>(align), static_cast<size_t>(rounded))));
  if (!data) fail("cannot allocate {} bytes", bytes);
  if (align == kHuge) madvise(data.get(), static_cast<size_t>(rounded), MADV_HUGEPAGE);
  return data;
}

void lay_out_linear_weight(const float* w, int64_t N, int64_t K, int64_t panel, float* wt) {
  lay_out_linear_weight_rows(reinterpret_cast<const uint8_t*>(w), 0, N, N, K, panel, wt);
}

namespace {

void write_functions(Writer& w, const std::vector<FunctionDesc>& functions) {
  w.i64(static_cast<int64_t>(functions.size()));
  for (const FunctionDesc& f : functions) {
    w.str(f.name);
    w.i64(f.arena_bytes);
    w.i64(static_cast<int64_t>(f.params.size()));
    for (const TensorDesc& t : f.params) w.tensor(t);
    w.i64(static_cast<int64_t>(f.results.size()));
    for (const TensorDesc& t : f.results) w.tensor(t);
    w.i64(static_cast<int64_t>(f.checks.size()));
    for (const DimCheck& c : f.checks) {
      w.dim(c.lhs);
      w.dim(c.rhs);
      w.str(c.what);
    }
    w.i64(static_cast<int64_t>(f.steps.size()));
    for (const StepDesc& s : f.steps) {
      w.i64(s.kernel);
      w.i64(static_cast<int64_t>(s.builtin));
      w.i64(static_cast<int64_t>(s.calls.size()));
      for (int32_t k : s.calls) w.i64(k);
      w.str(s.op);
      w.i64(static_cast<int64_t>(s.args.size()));
      for (const BufferDesc& b : s.args) {
        w.i64(static_cast<int64_t>(b.storage));
        w.i64(b.index);
        w.i64(b.byte_offset);
        w.dim(b.elem_offset);
        w.i64(type_code(b.type));
        w.dims(b.extents);
        w.dims(b.strides);
      }
    }
  }
}

}  // namespace

std::vector<uint8_t> serialize_plan(const Plan& p) {
  Writer w;
  w.out.insert(w.out.end(), kMagic, kMagic + 8);
  w.str(p.model);
  w.str(p.target);
  w.i64(static_cast<int64_t>(p.config.size()));
  for (const auto& [k, v] : p.config) {
    w.str(k);
    w.str(v);
  }
  w.i64(static_cast<int64_t>(p.symbols.size()));
  for (const SymbolDesc& s : p.symbols) {
    w.str(s.name);
    w.i64(s.max);
    w.i64(s.base);
    w.i64(s.scale);
    w.i64(s.offset);
  }
  w.i64(static_cast<int64_t>(p.kernel_names.size()));
  for (const std::string& k : p.kernel_names) w.str(k);
  w.i64(static_cast<int64_t>(p.weights.size()));
  for (const WeightDesc& wd : p.weights) {
    w.str(wd.name);
    w.i64(static_cast<int64_t>(wd.sources.size()));
    for (size_t i = 0; i < wd.sources.size(); ++i) {
      w.str(wd.sources[i]);
      w.ints(wd.source_shapes[i]);
    }
    w.i64(wd.transpose ? (wd.source_kn ? 2 : 1) : 0);
    w.i64(wd.panel);
    w.i64(wd.int8 ? 2 : wd.bf16 ? 1 : 0);  // how its elements are stored: f32, bf16 or int8
    w.ints(wd.shape);
  }
  w.i64(static_cast<int64_t>(p.tables.size()));
  for (const TableDesc& t : p.tables) {
    w.str(t.kind);
    w.i64(t.rows);
    w.i64(t.dim);
  }
  write_functions(w, p.functions);
  write_functions(w, p.fma_functions);
  return w.out;
}

namespace {

std::vector<FunctionDesc> read_functions(Reader& r) {
  std::vector<FunctionDesc> functions(r.count());
  for (FunctionDesc& f : functions) {
    f.name = r.str();
    f.arena_bytes = r.i64();
    f.params.resize(r.count());
    for (TensorDesc& t : f.params) t = r.tensor();
    f.results.resize(r.count());
    for (TensorDesc& t : f.results) t = r.tensor();
    f.checks.resize(r.count());
    for (DimCheck& c : f.checks) {
      c.lhs = r.dim();
      c.rhs = r.dim();
      c.what = r.str();
    }
    f.steps.resize(r.count());
    for (StepDesc& s : f.steps) {
      s.kernel = static_cast<int32_t>(r.i64());
      const int64_t builtin = r.i64();
      if (builtin < 0 || builtin > 2) fail("compiled plan: unknown builtin step {}", builtin);
      s.builtin = static_cast<Builtin>(builtin);
      s.calls.resize(r.count());
      for (int32_t& k : s.calls) k = static_cast<int32_t>(r.i64());
      s.op = r.str();
      s.args.resize(r.count());
      for (BufferDesc& b : s.args) {
        int64_t st = r.i64();
        if (st < 0 || st > 4) fail("compiled plan: unknown storage {}", st);
        b.storage = static_cast<Storage>(st);
        b.index = static_cast<int32_t>(r.i64());
        b.byte_offset = r.i64();
        b.elem_offset = r.dim();
        b.type = r.elem(r.i64());
        b.extents = r.dims();
        b.strides = r.dims();
      }
    }
  }
  return functions;
}

}  // namespace

Plan deserialize_plan(const uint8_t* data, size_t size) {
  Reader r(data, size);
  r.bytes(kMagic, 8);
  Plan p;
  p.model = r.str();
  p.target = r.str();
  p.config.resize(r.count());
  for (auto& [k, v] : p.config) {
    k = r.str();
    v = r.str();
  }
  p.symbols.resize(r.count(64));
  for (size_t i = 0; i < p.symbols.size(); ++i) {
    SymbolDesc& s = p.symbols[i];
    s.name = r.str();
    s.max = r.i64();
    const int64_t base = r.i64();
    s.scale = r.i64();
    s.offset = r.i64();
    if (s.max < 1) fail("compiled plan: symbol '{}' has maximum {}", s.name, s.max);
    // A derived symbol: of an earlier, free symbol, at least 1 at its base's 1, its maximum
    // at its base's.
    if (base < -1 || base >= static_cast<int64_t>(i) || (base >= 0 && p.symbols[base].base >= 0))
      fail("compiled plan: symbol '{}' derives from missing symbol {}", s.name, base);
    s.base = static_cast<int32_t>(base);
    int64_t top = 0;
    const bool bad = base < 0 ? s.scale != 1 || s.offset != 0
                              : s.scale < 1 || s.offset < 1 - s.scale ||
                                    __builtin_mul_overflow(s.scale, p.symbols[base].max, &top) ||
                                    __builtin_add_overflow(top, s.offset, &top) || top != s.max;
    if (bad)
      fail("compiled plan: symbol '{}' has a bad derivation ({}*#{}+{}, maximum {})", s.name,
           s.scale, base, s.offset, s.max);
  }
  p.kernel_names.resize(r.count());
  for (std::string& k : p.kernel_names) k = r.str();
  p.weights.resize(r.count());
  for (WeightDesc& wd : p.weights) {
    wd.name = r.str();
    int64_t n = r.count();
    for (int64_t i = 0; i < n; ++i) {
      wd.sources.push_back(r.str());
      wd.source_shapes.push_back(r.ints());
    }
    const int64_t transpose = r.i64();
    if (transpose < 0 || transpose > 2)
      fail("compiled plan: weight '{}' has an unknown transpose {}", wd.name, transpose);
    wd.transpose = transpose != 0;
    wd.source_kn = transpose == 2;
    wd.panel = r.i64();
    const int64_t stored = r.i64();
    if (stored < 0 || stored > 2)
      fail("compiled plan: weight '{}' has an unknown storage {}", wd.name, stored);
    wd.bf16 = stored == 1;
    wd.int8 = stored == 2;
    wd.shape = r.ints();
  }
  p.tables.resize(r.count());
  for (TableDesc& t : p.tables) {
    t.kind = r.str();
    t.rows = r.i64();
    t.dim = r.i64();
  }
  p.functions = read_functions(r);
  p.fma_functions = read_functions(r);
  if (!r.done()) fail("compiled plan has trailing bytes");
  validate(p);
  return p;
}

}  // namespace kiln::rt
