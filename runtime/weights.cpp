// Checking a checkpoint against expected weights (see weights.h), and loading a model's
// weights and building its tables (model.h).
#include "runtime/weights.h"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <set>
#include <span>
#include <sstream>

#include <unistd.h>

#include <fmt/format.h>

#include "runtime/json.h"
#include "runtime/model.h"
#include "support/error.h"
#include "support/sinusoid.h"

namespace kiln::rt {

std::string shape_string(const std::vector<int64_t>& shape) {
  return fmt::format("[{}]", fmt::join(shape, ","));
}

float f16_to_f32(uint16_t bits) {
  const uint32_t sign = (bits >> 15) & 1, exp = (bits >> 10) & 0x1F, frac = bits & 0x3FF;
  float v;
  if (exp == 0)
    v = std::ldexp(static_cast<float>(frac), -24);  // zero or subnormal: frac · 2^-24
  else if (exp == 31)
    v = frac ? std::numeric_limits<float>::quiet_NaN() : std::numeric_limits<float>::infinity();
  else
    v = std::ldexp(static_cast<float>(frac | 0x400), static_cast<int>(exp) - 25);
  return sign ? -v : v;
}

namespace {
namespace fs = std::filesystem;

std::string read_text(const fs::path& path, const std::string& what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("cannot open {} '{}': {}", what, path.string(), std::strerror(errno));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) fail("cannot read {} '{}'", what, path.string());
  return text.str();
}
}  // namespace

Checkpoint Checkpoint::load(const std::string& path) {
  Checkpoint c;
  c.label_ = path;
  std::error_code ec;
  fs::path file = path;
  if (fs::is_directory(file, ec)) {
    if (fs::exists(file / "model.safetensors.index.json", ec)) {
      file = file / "model.safetensors.index.json";
    } else {
      std::vector<fs::path> found;
      for (const auto& e : fs::directory_iterator(file, ec))
        if (e.path().extension() == ".safetensors") found.push_back(e.path());
      if (found.size() != 1)
        fail(
            "checkpoint folder '{}' holds neither model.safetensors.index.json nor exactly one "
            ".safetensors file ({} found)",
            path, found.size());
      file = found[0];
    }
    c.label_ = file.string();
  }
  const std::string name = file.filename().string();
  if (name.size() < 11 || name.substr(name.size() - 11) != ".index.json") {
    c.shards_.push_back(SafeTensors::load(file.string()));
    for (const TensorInfo& t : c.shards_[0].tensors()) c.where_[t.name] = {0, &t};
    return c;
  }
  // A sharded checkpoint.
  json::Value index;
  try {
    index = json::parse(read_text(file, "checkpoint index"));
  } catch (const Error& e) {
    fail("checkpoint index '{}' is not valid JSON: {}", c.label_, e.what());
  }
  const json::Value* map = index.is_object() ? index.find("weight_map") : nullptr;
  if (!map || !map->is_object())
    fail("checkpoint index '{}' has no \"weight_map\" object (tensor name -> shard file)",
         c.label_);
  std::map<std::string, size_t> shard_of_file;
  std::vector<std::vector<std::string>> listed;  // per shard, the tensors the index names
  for (const auto& [tensor, shard] : map->as_object()) {
    if (!shard.is_string())
      fail("checkpoint index '{}': the shard of tensor '{}' is not a file name", c.label_, tensor);
    const std::string& f = shard.as_string();
    if (f.empty() || f.find('/') != std::string::npos || f == "." || f == "..")
      fail(
          "checkpoint index '{}': shard '{}' of tensor '{}' is not a plain file name beside the "
          "index",
          c.label_, f, tensor);
    auto [it, fresh] = shard_of_file.try_emplace(f, c.shards_.size());
    if (fresh) {
      c.shards_.push_back(SafeTensors::load((file.parent_path() / f).string()));
      listed.emplace_back();
    }
    listed[it->second].push_back(tensor);
  }
  for (size_t si = 0; si < c.shards_.size(); ++si) {
    const SafeTensors& shard = c.shards_[si];
    for (const std::string& tensor : listed[si]) {
      const TensorInfo* t = shard.find(tensor);
      if (!t)
        fail("checkpoint index '{}' puts tensor '{}' in shard '{}', which does not have it",
             c.label_, tensor, shard.label());
      c.where_[tensor] = {si, t};
    }
    for (const TensorInfo& t : shard.tensors()) {
      auto w = c.where_.find(t.name);
      if (w == c.where_.end())
        fail("shard '{}' has tensor '{}', which checkpoint index '{}' does not name", shard.label(),
             t.name, c.label_);
      if (w->second.first != si)
        fail("tensor '{}' is in shard '{}' and in shard '{}' (checkpoint index '{}')", t.name,
             c.shards_[w->second.first].label(), shard.label(), c.label_);
    }
  }
  return c;
}

const TensorInfo* Checkpoint::find(std::string_view name) const {
  auto it = where_.find(name);
  return it == where_.end() ? nullptr : it->second.second;
}

std::span<const uint8_t> Checkpoint::bytes(const TensorInfo& tensor) const {
  return file_of(tensor).bytes(tensor);
}

const SafeTensors& Checkpoint::file_of(const TensorInfo& tensor) const {
  auto it = where_.find(tensor.name);
  KILN_ASSERT(it != where_.end() && it->second.second == &tensor,
              "Checkpoint::file_of: a tensor of another checkpoint");
  return shards_[it->second.first];
}

std::vector<const TensorInfo*> Checkpoint::tensors() const {
  std::vector<const TensorInfo*> out;
  for (const SafeTensors& s : shards_)
    for (const TensorInfo& t : s.tensors()) out.push_back(&t);
  return out;
}

namespace {
// check_weights over any file: its lookup and its tensors.
template <typename Find>
std::vector<std::string> weight_problems(const Find& find,
                                         const std::vector<const TensorInfo*>& all,
                                         const std::vector<WeightSpec>& expected) {
  std::vector<std::string> problems;
  std::set<std::string> wanted;
  for (const WeightSpec& w : expected) {
    wanted.insert(w.name);
    const TensorInfo* t = find(w.name);
    if (!t) {
      problems.push_back(fmt::format("missing tensor '{}' (expected {} {})", w.name,
                                     dtype_name(w.dtype), shape_string(w.shape)));
      continue;
    }
    if (t->dtype != w.dtype && !(w.or_half && (t->dtype == DType::bf16 || t->dtype == DType::f16)))
      problems.push_back(fmt::format("tensor '{}' has dtype {}, expected {}{}", w.name,
                                     dtype_name(t->dtype), dtype_name(w.dtype),
                                     w.or_half ? " (or BF16 or F16)" : ""));
    if (t->shape != w.shape)
      problems.push_back(fmt::format("tensor '{}' has shape {}, expected {}", w.name,
                                     shape_string(t->shape), shape_string(w.shape)));
  }
  for (const TensorInfo* t : all)
    if (!wanted.count(t->name))
      problems.push_back(fmt::format("unexpected tensor '{}' {} {}", t->name, dtype_name(t->dtype),
                                     shape_string(t->shape)));
  return problems;
}

void throw_problems(const std::string& label, const std::vector<std::string>& problems) {
  if (problems.empty()) return;
  std::string msg = fmt::format("weights '{}' do not match the model ({} problem{}):", label,
                                problems.size(), problems.size() == 1 ? "" : "s");
  for (const std::string& p : problems) msg += "\n  " + p;
  throw Error(msg);
}
}  // namespace

std::vector<std::string> check_weights(const Checkpoint& file,
                                       const std::vector<WeightSpec>& expected) {
  return weight_problems([&](std::string_view n) { return file.find(n); }, file.tensors(),
                         expected);
}

std::vector<std::string> check_weights(const SafeTensors& file,
                                       const std::vector<WeightSpec>& expected) {
  std::vector<const TensorInfo*> all;
  for (const TensorInfo& t : file.tensors()) all.push_back(&t);
  return weight_problems([&](std::string_view n) { return file.find(n); }, all, expected);
}

void check_weights_or_throw(const Checkpoint& file, const std::vector<WeightSpec>& expected) {
  throw_problems(file.label(), check_weights(file, expected));
}

void check_weights_or_throw(const SafeTensors& file, const std::vector<WeightSpec>& expected) {
  throw_problems(file.label(), check_weights(file, expected));
}

namespace {

constexpr char kLaidOutMagic[8] = {'K', 'I', 'L', 'N', 'W', 'G', 'T', '\0'};
constexpr uint64_t kLaidOutVersion = 1;
constexpr uint64_t kLaidOutAlign = 4096;  // each weight on a page of its own

// FNV-1a (64 bits) of the plan's weights as they are laid out: names, sources, shapes and
// layouts. Two plans with one hash lay out the same bytes from the same checkpoint.
uint64_t layout_hash(const Plan& plan) {
  std::string text;
  for (const WeightDesc& w : plan.weights) {
    text += fmt::format("{};{};", w.name, fmt::join(w.sources, ","));
    for (const auto& s : w.source_shapes) text += shape_string(s);
    text += fmt::format(";{};{};{};{};{};{}\n", w.transpose, w.panel, shape_string(w.shape), w.bf16,
                        w.int8, weight_bytes(w));
  }
  uint64_t h = 14695981039346656037ull;
  for (unsigned char c : text) h = (h ^ c) * 1099511628211ull;
  return h;
}

uint64_t read_u64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);  // little-endian hosts only (safetensors.cpp asserts it)
  return v;
}

bool is_laid_out(const std::string& path) {
  if (!is_regular_file(path)) return false;
  std::ifstream in(path, std::ios::binary);
  char head[8] = {};
  in.read(head, 8);
  return in.gcount() == 8 && std::memcmp(head, kLaidOutMagic, 8) == 0;
}

// The laid-out weights file at `path` (write_laid_out_weights), every weight bound to its
// pages.
LoadedWeights map_laid_out(const Plan& plan, const std::string& path) {
  std::shared_ptr<const MappedFile> file = MappedFile::map(path, "laid-out weights");
  const uint8_t* d = file->data();
  const uint64_t size = file->size();
  auto bad = [&](const std::string& why) {
    fail("laid-out weights '{}' {}: write them again with 'kiln pack-weights'", path, why);
  };
  if (size < 48) bad(fmt::format("are truncated ({} bytes, shorter than their header)", size));
  if (const uint64_t v = read_u64(d + 8); v != kLaidOutVersion)
    bad(fmt::format("have format version {}, this runtime reads version {}", v, kLaidOutVersion));
  const uint64_t count = read_u64(d + 24), declared = read_u64(d + 32), name_len = read_u64(d + 40);
  if (declared != size)
    bad(fmt::format("are {} bytes, their header says {} (truncated or changed)", size, declared));
  if (name_len > size - 48 || count > (size - 48 - name_len) / 16)
    bad(fmt::format("have a header longer than the file ({} bytes)", size));
  const std::string model(reinterpret_cast<const char*>(d + 48), name_len);
  if (const uint64_t h = read_u64(d + 16); h != layout_hash(plan) || count != plan.weights.size())
    bad(fmt::format(
        "were written for another model or weight layout (model '{}', {} weights, layout hash "
        "{:016x}; this library: model '{}', {} weights, layout hash {:016x})",
        model, count, h, plan.model, plan.weights.size(), layout_hash(plan)));
  LoadedWeights out;
  out.buffers.resize(plan.weights.size());
  uint64_t end = 48 + name_len + 16 * count;
  for (size_t wi = 0; wi < plan.weights.size(); ++wi) {
    const uint64_t offset = read_u64(d + 48 + name_len + 16 * wi);
    const uint64_t bytes = read_u64(d + 56 + name_len + 16 * wi);
    const WeightDesc& w = plan.weights[wi];
    if (bytes != static_cast<uint64_t>(weight_bytes(w)) || offset % kLaidOutAlign != 0 ||
        offset < end || offset > size || bytes > size - offset)
      bad(fmt::format(
          "put weight '{}' at bytes [{}, {}) of {}, expected {} bytes at a multiple of {} after "
          "byte {}",
          w.name, offset, offset + bytes, size, weight_bytes(w), kLaidOutAlign, end));
    end = offset + bytes;
    out.buffers[wi].data = AlignedStorage(const_cast<uint8_t*>(d + offset), FreeDeleter{false});
    out.buffers[wi].size = static_cast<int64_t>(bytes);
  }
  out.files.push_back(std::move(file));
  return out;
}

}  // namespace

void write_laid_out_weights(const Plan& plan, const std::vector<AlignedBytes>& weights,
                            const std::string& path) {
  KILN_ASSERT(weights.size() == plan.weights.size(), "write_laid_out_weights: not the plan's");
  std::vector<uint64_t> header(6 + 2 * weights.size());
  std::memcpy(&header[0], kLaidOutMagic, 8);
  header[1] = kLaidOutVersion;
  header[2] = layout_hash(plan);
  header[3] = weights.size();
  header[5] = plan.model.size();
  uint64_t at = 48 + plan.model.size() + 16 * weights.size();
  for (size_t wi = 0; wi < weights.size(); ++wi) {
    at = (at + kLaidOutAlign - 1) / kLaidOutAlign * kLaidOutAlign;
    header[6 + 2 * wi] = at;
    header[7 + 2 * wi] = static_cast<uint64_t>(weights[wi].size);
    at += static_cast<uint64_t>(weights[wi].size);
  }
  header[4] = at;
  const std::string tmp = fmt::format("{}.tmp{}", path, ::getpid());
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> f(std::fopen(tmp.c_str(), "wb"), std::fclose);
  if (!f) fail("cannot write laid-out weights '{}': {}", tmp, std::strerror(errno));
  bool ok = std::fwrite(header.data(), 8, 6, f.get()) == 6 &&
            std::fwrite(plan.model.data(), 1, plan.model.size(), f.get()) == plan.model.size() &&
            std::fwrite(header.data() + 6, 8, header.size() - 6, f.get()) == header.size() - 6;
  uint64_t written = 48 + plan.model.size() + 16 * weights.size();
  const std::vector<uint8_t> zeros(kLaidOutAlign, 0);
  for (size_t wi = 0; ok && wi < weights.size(); ++wi) {
    const uint64_t pad = header[6 + 2 * wi] - written;
    const size_t n = static_cast<size_t>(weights[wi].size);
    ok = std::fwrite(zeros.data(), 1, pad, f.get()) == pad &&
         std::fwrite(weights[wi].data.get(), 1, n, f.get()) == n;
    written += pad + n;
  }
  ok = ok && std::fflush(f.get()) == 0;
  const int e = errno;
  if (std::fclose(f.release()) != 0 || !ok) {
    std::remove(tmp.c_str());
    fail("cannot write laid-out weights '{}': {}", tmp, std::strerror(ok ? errno : e));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int r = errno;
    std::remove(tmp.c_str());
    fail("cannot write laid-out weights '{}': {}", path, std::strerror(r));
  }
}

LoadedWeights load_weights(const Plan& plan, const std::string& path) {
  if (is_laid_out(path)) return map_laid_out(plan, path);
  LoadedWeights loaded;
  std::vector<AlignedBytes>& weights = loaded.buffers;
  const Checkpoint file = Checkpoint::load(path);
  std::vector<WeightSpec> expected;
  std::map<std::string, bool> seen;
  for (const auto& w : plan.weights)
    for (size_t i = 0; i < w.sources.size(); ++i)
      if (!seen[w.sources[i]]) {
        seen[w.sources[i]] = true;
        expected.push_back({w.sources[i], DType::f32, w.source_shapes[i], true});  // or_half
      }
  check_weights_or_throw(file, expected);
  weights.resize(plan.weights.size());
  std::set<std::string> bound;  // the sources that weights are bound to
  for (size_t wi = 0; wi < plan.weights.size(); ++wi) {
    const auto& w = plan.weights[wi];
    // Concatenation along axis 0, straight from the file's bytes into the laid-out weight
    // (a linear weight as its kernel reads it): each source is a block of rows.
    // Each source is f32 or bf16 (checked above), converted to what the kernels read.
    int64_t numel = 1, source_numel = 0;
    for (int64_t d : w.shape) numel *= d;
    std::vector<std::span<const uint8_t>> parts;
    std::vector<bool> part_bf16;
    std::vector<std::vector<float>> widened;  // F16 sources, converted to f32 (exact)
    for (const std::string& s : w.sources) {
      const TensorInfo& info = *file.find(s);  // checked above
      parts.push_back(file.bytes(info));
      if (info.dtype == DType::f16) {
        std::vector<float>& f = widened.emplace_back(parts.back().size() / 2);
        for (size_t i = 0; i < f.size(); ++i) {
          uint16_t h;
          std::memcpy(&h, parts.back().data() + 2 * i, 2);
          f[i] = f16_to_f32(h);
        }
        parts.back() = {reinterpret_cast<const uint8_t*>(f.data()), f.size() * 4};
      }
      part_bf16.push_back(info.dtype == DType::bf16);
      source_numel += static_cast<int64_t>(parts.back().size() / (part_bf16.back() ? 2 : 4));
    }
    // [in, out] sources [K, N_i]: each transposed to rows of W[N, K] (f32) here, then laid
    // out as any.
    std::vector<std::vector<float>> transposed(w.source_kn ? parts.size() : 0);
    for (size_t pi = 0; w.source_kn && pi < parts.size(); ++pi) {
      const std::vector<int64_t>& kn = w.source_shapes.at(pi);
      const int64_t part_numel = static_cast<int64_t>(parts[pi].size() / (part_bf16[pi] ? 2 : 4));
      if (kn.size() != 2 || kn[0] * kn[1] != part_numel || kn[0] != w.source_shapes.at(0).at(0))
        fail("weight '{}' (from '{}') has {} elements, the plan expects [{}]", w.name,
             w.sources[pi], part_numel, fmt::join(kn, ", "));
      const int64_t k_in = kn[0], n_out = kn[1];
      std::vector<float>& t = transposed[pi];
      t.resize(static_cast<size_t>(part_numel));
      const uint8_t* src = parts[pi].data();
      for (int64_t k = 0; k < k_in; ++k)
        for (int64_t n = 0; n < n_out; ++n) {
          const int64_t i = k * n_out + n;
          float v;
          if (part_bf16[pi]) {
            uint16_t b;
            std::memcpy(&b, src + 2 * i, 2);
            v = bf16_to_f32(b);
          } else {
            std::memcpy(&v, src + 4 * i, 4);
          }
          t[static_cast<size_t>(n * k_in + k)] = v;
        }
      parts[pi] = {reinterpret_cast<const uint8_t*>(t.data()), t.size() * 4};
      part_bf16[pi] = false;
    }
    // A linear weight W[N, K] (its sources are blocks of rows of K; the bf16 layout pads
    // N to a multiple of 64 and K to even, the int8 one to a multiple of 4).
    const int64_t K = !w.transpose || w.source_shapes.empty() || w.source_shapes[0].empty() ? 1
                      : w.source_kn ? w.source_shapes[0].front()
                                    : w.source_shapes[0].back();
    const int64_t group = w.bf16 ? 2 : w.int8 ? 4 : 0;  // K adjacent in the packed layout
    if (group ? (K < 1 || source_numel % K != 0 || (source_numel / K + 63) / 64 != w.shape[0] ||
                 (K + group - 1) / group != w.shape[1])
              : source_numel != numel)
      fail("weight '{}' has {} elements, the plan expects {}", w.name, source_numel,
           group ? fmt::format("[N, K] with N/64 = {}, K/{} = {} (rounded up)", w.shape[0], group,
                               w.shape[1])
                 : std::to_string(numel));
    const int64_t bytes = weight_bytes(w);
    // Read as stored: bound to the mapped file's pages (f32 elements, aligned for them).
    if (!w.transpose && parts.size() == 1 && !part_bf16[0] && widened.empty() &&
        static_cast<int64_t>(parts[0].size()) == bytes &&
        reinterpret_cast<uintptr_t>(parts[0].data()) % 4 == 0 &&
        file.file_of(*file.find(w.sources[0])).mapping()) {
      weights[wi].data = AlignedStorage(const_cast<uint8_t*>(parts[0].data()), FreeDeleter{false});
      weights[wi].size = bytes;
      bound.insert(w.sources[0]);
      continue;
    }
    weights[wi].allocate(bytes);
    if (group) std::memset(weights[wi].data.get(), 0, static_cast<size_t>(bytes));
    if (w.transpose) {
      // Stored as [K, N], [N/panel, K, panel], [Np/64, Kp/2, 64, 2] or int8 (the plan is
      // validated) from W[N, K].
      int64_t row = 0;
      for (size_t pi = 0; pi < parts.size(); ++pi) {
        const bool b = part_bf16[pi];
        const int64_t rows = static_cast<int64_t>(parts[pi].size() / (b ? 2 : 4)) / K;
        if (w.bf16) {
          lay_out_linear_weight_bf16_rows(parts[pi].data(), row, rows, source_numel / K, K,
                                          reinterpret_cast<uint16_t*>(weights[wi].data.get()), b);
        } else if (w.int8) {
          const int64_t bad = lay_out_linear_weight_int8_rows(
              parts[pi].data(), row, rows, source_numel / K, K, weights[wi].data.get(), b);
          if (bad >= 0)
            fail(
                "weight '{}' (from '{}'): row {} has a value that is not finite (NaN or "
                "infinite): int8 weights are quantized by each row's largest magnitude",
                w.name, w.sources[pi], bad - row);
        } else {
          lay_out_linear_weight_rows(parts[pi].data(), row, rows, numel / K, K, w.panel,
                                     reinterpret_cast<float*>(weights[wi].data.get()), b);
        }
        row += rows;
      }
    } else {
      float* out = reinterpret_cast<float*>(weights[wi].data.get());
      for (size_t pi = 0; pi < parts.size(); ++pi) {
        const int64_t n = static_cast<int64_t>(parts[pi].size() / (part_bf16[pi] ? 2 : 4));
        if (part_bf16[pi])
          for (int64_t i = 0; i < n; ++i) {
            uint16_t b;
            std::memcpy(&b, parts[pi].data() + 2 * i, 2);
            out[i] = bf16_to_f32(b);
          }
        else
          std::memcpy(out, parts[pi].data(), parts[pi].size());
        out += n;
      }
    }
  }
  // The files that weights are bound to stay mapped, less the pages only copied from.
  for (const SafeTensors& shard : file.shards()) {
    if (!shard.mapping()) continue;
    bool keep = false;
    for (const TensorInfo& t : shard.tensors()) keep = keep || bound.count(t.name);
    if (!keep) continue;
    for (const TensorInfo& t : shard.tensors())
      if (!bound.count(t.name))
        shard.mapping()->release(shard.file_offset(t), shard.file_offset(t) + t.nbytes());
    loaded.files.push_back(shard.mapping());
  }
  return loaded;
}

std::vector<AlignedBytes> build_tables(const Plan& plan) {
  std::vector<AlignedBytes> tables;
  tables.resize(plan.tables.size());
  for (size_t ti = 0; ti < plan.tables.size(); ++ti) {
    const auto& t = plan.tables[ti];
    if (t.kind != "sinusoid") fail("unknown table kind '{}'", t.kind);
    tables[ti].allocate(t.rows * t.dim * 4);
    fill_sinusoid_table(t.rows, t.dim, reinterpret_cast<float*>(tables[ti].data.get()));
  }
  return tables;
}

}  // namespace kiln::rt
