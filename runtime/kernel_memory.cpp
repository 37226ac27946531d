#include "runtime/kernel_memory.h"

#include <array>
#include <atomic>
#include <cstdlib>

namespace kiln::rt {

namespace {

// A block: kPad bytes (the capacity at 16 bytes before the block, kMark at 8), the capacity,
// kPad bytes more. kMark is not a user-space address, so it tells a block of kernel_malloc
// from one of Halide's default allocator, which stores the malloc'd pointer at 8 bytes before.
constexpr size_t kPad = 64;
constexpr uint64_t kMark = 0x6b696c6e5f6d656dull;  // "kiln_mem"

std::atomic<uint64_t> g_reused{0}, g_allocated{0};
std::atomic<FreeFn> g_foreign_free{nullptr};

size_t& capacity_of(void* block) {
  return *reinterpret_cast<size_t*>(static_cast<char*>(block) - 16);
}
uint64_t& mark_of(void* block) {
  return *reinterpret_cast<uint64_t*>(static_cast<char*>(block) - 8);
}

// The blocks a thread has freed and keeps, unordered.
struct KeptBlocks {
  std::array<void*, kKeptBlocks> blocks{};
  int count = 0;
  size_t bytes = 0;
  bool alive = true;  // false once the thread's exit destroyed it: frees go to the system

  ~KeptBlocks() {
    for (int i = 0; i < count; ++i) std::free(static_cast<char*>(blocks[i]) - kPad);
    count = 0;
    bytes = 0;
    alive = false;
  }

  // The smallest kept block that holds `bytes` and is at most about twice as large (a
  // large block is not spent on a small request), removed; nullptr if none.
  void* take(size_t bytes_wanted) {
    int best = -1;
    for (int i = 0; i < count; ++i) {
      const size_t c = capacity_of(blocks[i]);
      if (c >= bytes_wanted && c <= 2 * bytes_wanted + 4096 &&
          (best < 0 || c < capacity_of(blocks[best])))
        best = i;
    }
    if (best < 0) return nullptr;
    void* block = blocks[best];
    bytes -= capacity_of(block);
    blocks[best] = blocks[--count];
    return block;
  }

  bool keep(void* block) {
    const size_t c = capacity_of(block);
    if (!alive || count == kKeptBlocks || c > kKeptBytes - bytes) return false;
    blocks[count++] = block;
    bytes += c;
    return true;
  }
};

thread_local KeptBlocks t_kept;

}  // namespace

void* kernel_malloc(void* /*user_context*/, size_t bytes) {
  // Multiples of 4 KiB from 4 KiB on (blocks of nearby sizes, as a kernel's last tile asks
  // for, fit each other), of 64 bytes below.
  const size_t unit = bytes >= 4096 ? 4096 : kPad;
  if (bytes > (SIZE_MAX >> 1)) return nullptr;
  const size_t capacity = bytes == 0 ? kPad : (bytes + unit - 1) / unit * unit;
  if (void* block = t_kept.take(capacity)) {
    g_reused.fetch_add(1, std::memory_order_relaxed);
    return block;
  }
  char* base = static_cast<char*>(std::aligned_alloc(kPad, capacity + 2 * kPad));
  if (base == nullptr) return nullptr;
  g_allocated.fetch_add(1, std::memory_order_relaxed);
  void* block = base + kPad;
  capacity_of(block) = capacity;
  mark_of(block) = kMark;
  return block;
}

void kernel_free(void* user_context, void* block) {
  if (block == nullptr) return;
  if (mark_of(block) != kMark) {
    // Not ours: allocated before kiln installed this allocator, by Halide code that shares
    // the library's runtime.
    if (FreeFn f = g_foreign_free.load(std::memory_order_acquire)) f(user_context, block);
    return;
  }
  if (!t_kept.keep(block)) std::free(static_cast<char*>(block) - kPad);
}

void set_foreign_free(FreeFn free_fn) {
  if (free_fn != nullptr && free_fn != &kernel_free)
    g_foreign_free.store(free_fn, std::memory_order_release);
}

KernelMemoryStats kernel_memory_stats() {
  return {g_reused.load(std::memory_order_relaxed), g_allocated.load(std::memory_order_relaxed)};
}

}  // namespace kiln::rt
