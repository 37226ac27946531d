// The runtime's builtin steps (see builtins.h).
#include "runtime/builtins.h"

#include <cstring>

#include <fmt/format.h>

#include "support/error.h"

namespace kiln::rt {

void cache_write(const StepDesc& step, const std::vector<const uint8_t*>& param_data,
                 const uint8_t* arena_data, const std::vector<uint8_t*>& result_data,
                 const std::vector<int64_t>& result_bytes, const std::vector<int64_t>& syms) {
  const bool at_pos = step.args.size() == 3;
  const BufferDesc &x = step.args[0], &cache = step.args.back();
  KILN_ASSERT(x.storage != Storage::result && (!at_pos || step.args[1].storage == Storage::param) &&
                  cache.storage == Storage::result && cache.byte_offset == 0,
              fmt::format("step '{}': a cache_write's buffers are misplaced", step.op));
  const int64_t d = x.extents[0].eval(syms), len = x.extents[1].eval(syms),
                n = x.extents[2].eval(syms);
  const int64_t c = cache.extents[1].eval(syms), t = cache.extents[2].eval(syms);
  int64_t at = 0;
  if (at_pos) {
    const BufferDesc& pos = step.args[1];
    at = *reinterpret_cast<const int64_t*>(param_data[pos.index] + pos.elem_offset.eval(syms) * 8);
  }
  KILN_ASSERT(d == cache.extents[0].eval(syms) && n <= c && at >= 0 && at + len <= t,
              fmt::format("step '{}': cache_write out of bounds", step.op));
  const int64_t x_pos = x.strides[1].eval(syms), x_row = x.strides[2].eval(syms),
                c_slot = cache.strides[1].eval(syms), c_pos = cache.strides[2].eval(syms);
  KILN_ASSERT(((at + len - 1) * c_pos + (c - 1) * c_slot + d) * 4 <= result_bytes[cache.index],
              fmt::format("step '{}': cache_write outside the cache", step.op));
  const uint8_t* src_base = nullptr;
  switch (x.storage) {
    case Storage::param:
      src_base = param_data[x.index];
      break;
    case Storage::arena:
      src_base = arena_data;
      break;
    default:
      fail("step '{}': a cache_write reads from unsupported storage", step.op);
  }
  const float* src =
      reinterpret_cast<const float*>(src_base + x.byte_offset) + x.elem_offset.eval(syms);
  float* dst = reinterpret_cast<float*>(result_data[cache.index]);
  for (int64_t l = 0; l < len; ++l)
    for (int64_t r = 0; r < n; ++r)
      std::memcpy(dst + (at + l) * c_pos + r * c_slot, src + r * x_row + l * x_pos,
                  static_cast<size_t>(d) * sizeof(float));
}

}  // namespace kiln::rt
