// The kernels' scratch allocator (runtime/kernel_memory.h): aligned blocks with readable
// padding, a thread's freed blocks handed out again for requests they fit, within the kept
// count and bytes, and blocks freed on another thread kept by that thread.
#include "runtime/kernel_memory.h"

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

namespace kiln::rt {
namespace {

// Each test starts from a thread that has kept nothing: its own new thread.
template <typename F>
void on_new_thread(F f) {
  std::thread t(f);
  t.join();
}

TEST(KernelMemory, BlocksAreAlignedWritableAndPadded) {
  on_new_thread([] {
    for (size_t bytes : {size_t{0}, size_t{1}, size_t{63}, size_t{4097}, size_t{300000}}) {
      auto* block = static_cast<unsigned char*>(kernel_malloc(nullptr, bytes));
      ASSERT_NE(block, nullptr) << bytes;
      EXPECT_EQ(reinterpret_cast<uintptr_t>(block) % 64, 0u) << bytes;
      std::memset(block, 0xab, bytes);
      // Halide reads up to 8 bytes before a block and past its end.
      volatile unsigned char before = block[-8], after = block[bytes + 7];
      (void)before;
      (void)after;
      kernel_free(nullptr, block);
    }
    kernel_free(nullptr, nullptr);  // as free(NULL)
  });
}

TEST(KernelMemory, AFreedBlockIsHandedOutAgainForARequestItFits) {
  on_new_thread([] {
    void* a = kernel_malloc(nullptr, 300000);
    kernel_free(nullptr, a);
    const KernelMemoryStats before = kernel_memory_stats();
    // A request a little smaller (a kernel's last tile) gets the same block, from the kept.
    EXPECT_EQ(kernel_malloc(nullptr, 290000), a);
    const KernelMemoryStats after = kernel_memory_stats();
    EXPECT_EQ(after.reused, before.reused + 1);
    // A larger request than it holds does not, nor a much smaller one.
    void* larger = kernel_malloc(nullptr, 400000);
    EXPECT_NE(larger, a);
    kernel_free(nullptr, a);
    void* small = kernel_malloc(nullptr, 1000);
    EXPECT_NE(small, a);
    // The large block is still kept: the same size gets it.
    EXPECT_EQ(kernel_malloc(nullptr, 300000), a);
    for (void* p : {a, larger, small}) kernel_free(nullptr, p);
  });
}

TEST(KernelMemory, AThreadKeepsAtMostItsCountAndBytes) {
  on_new_thread([] {
    const int n = kKeptBlocks + 4;
    std::vector<void*> blocks;
    for (int i = 0; i < n; ++i) blocks.push_back(kernel_malloc(nullptr, 8192));
    for (void* p : blocks) kernel_free(nullptr, p);
    const KernelMemoryStats before = kernel_memory_stats();
    blocks.clear();
    for (int i = 0; i < n; ++i) blocks.push_back(kernel_malloc(nullptr, 8192));
    const KernelMemoryStats after = kernel_memory_stats();
    // (The counts are the process's: nothing else in this test binary allocates meanwhile.)
    EXPECT_EQ(after.reused - before.reused, static_cast<uint64_t>(kKeptBlocks));
    EXPECT_EQ(after.allocated - before.allocated, 4u);
    for (void* p : blocks) kernel_free(nullptr, p);
  });
  on_new_thread([] {
    // Two blocks of 40 MiB: the second one would pass kKeptBytes (64 MiB), so only one is kept.
    const size_t big = size_t{40} << 20;
    void* a = kernel_malloc(nullptr, big);
    void* b = kernel_malloc(nullptr, big);
    kernel_free(nullptr, a);
    kernel_free(nullptr, b);
    const KernelMemoryStats before = kernel_memory_stats();
    void* c = kernel_malloc(nullptr, big);
    void* d = kernel_malloc(nullptr, big);
    const KernelMemoryStats after = kernel_memory_stats();
    EXPECT_EQ(c, a);
    EXPECT_EQ(after.reused - before.reused, 1u);
    EXPECT_EQ(after.allocated - before.allocated, 1u);
    kernel_free(nullptr, c);
    kernel_free(nullptr, d);
  });
}

TEST(KernelMemory, ABlockFreedOnAnotherThreadIsKeptThere) {
  void* block = nullptr;
  on_new_thread([&] { block = kernel_malloc(nullptr, 200000); });
  on_new_thread([&] {
    kernel_free(nullptr, block);
    EXPECT_EQ(kernel_malloc(nullptr, 200000), block);
    kernel_free(nullptr, block);
  });
  // The thread that kept it has ended and given it back: a new thread starts with nothing.
  on_new_thread([] {
    const KernelMemoryStats before = kernel_memory_stats();
    kernel_free(nullptr, kernel_malloc(nullptr, 200000));
    EXPECT_EQ(kernel_memory_stats().reused, before.reused);
  });
}

// A block of another allocator (Halide's default one stores the malloc'd pointer 8 bytes
// before the block) goes to the free function that was installed before kiln's.
int g_foreign_frees = 0;
void* foreign_malloc(size_t bytes) {
  auto* base = static_cast<char*>(std::malloc(bytes + 128));
  char* block = base + 64;
  std::memcpy(block - 8, &base, sizeof base);
  return block;
}
void foreign_free(void* /*user_context*/, void* block) {
  ++g_foreign_frees;
  char* base;
  std::memcpy(&base, static_cast<char*>(block) - 8, sizeof base);
  std::free(base);
}

TEST(KernelMemory, AForeignBlockGoesToTheFreeInstalledBefore) {
  set_foreign_free(foreign_free);
  on_new_thread([] {
    void* block = foreign_malloc(300000);
    const KernelMemoryStats before = kernel_memory_stats();
    kernel_free(nullptr, block);
    EXPECT_EQ(g_foreign_frees, 1);
    // It was not kept: a request it would fit comes from the system.
    void* next = kernel_malloc(nullptr, 300000);
    EXPECT_NE(next, block);
    EXPECT_EQ(kernel_memory_stats().reused, before.reused);
    kernel_free(nullptr, next);
    EXPECT_EQ(g_foreign_frees, 1);
  });
}

}  // namespace
}  // namespace kiln::rt
