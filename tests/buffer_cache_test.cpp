// kiln_generate's kept buffers (runtime/model.h, BufferCache): a block given back is handed
// out again for a request it fits (its size up to twice the request, the smallest such),
// never for a larger request or one it would waste more than half of, and what is kept stays
// within kKeptBytes, the oldest blocks going first.
#include <cstdint>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "runtime/model.h"

namespace kiln::rt {
namespace {

TEST(BufferCache, GivenBlocksAreTakenAgainWhereTheyFit) {
  BufferCache cache;
  EXPECT_EQ(cache.kept_bytes(), 0);
  AlignedBytes a = cache.take(1000);
  ASSERT_NE(a.data, nullptr);
  EXPECT_EQ(a.size, 1000);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a.data.get()) % 64, 0u);
  const uint8_t* at = a.data.get();
  cache.give(std::move(a));
  EXPECT_EQ(cache.kept_bytes(), 1000);

  AlignedBytes larger = cache.take(1001);  // does not fit: a new block, the kept one stays
  EXPECT_NE(larger.data.get(), at);
  EXPECT_EQ(larger.size, 1001);
  EXPECT_EQ(cache.kept_bytes(), 1000);
  AlignedBytes small = cache.take(499);  // would waste more than half: a new block
  EXPECT_NE(small.data.get(), at);
  AlignedBytes fits = cache.take(500);  // at most twice the request: the kept one
  EXPECT_EQ(fits.data.get(), at);
  EXPECT_EQ(fits.size, 1000);
  EXPECT_EQ(cache.kept_bytes(), 0);

  // The smallest that fits, whatever the order given back.
  const uint8_t* at_larger = larger.data.get();
  cache.give(std::move(larger));  // 1001
  cache.give(std::move(fits));    // 1000
  cache.give(std::move(small));   // 499
  EXPECT_EQ(cache.kept_bytes(), 2500);
  EXPECT_EQ(cache.take(900).data.get(), at);
  EXPECT_EQ(cache.take(900).data.get(), at_larger);
  EXPECT_EQ(cache.kept_bytes(), 499);
  cache.give(AlignedBytes{});  // an empty block is not kept
  EXPECT_EQ(cache.kept_bytes(), 499);
}

TEST(BufferCache, KeepsAtMostKeptBytesOldestGoingFirst) {
  BufferCache cache;
  const int64_t quarter = BufferCache::kKeptBytes / 4;
  std::vector<AlignedBytes> blocks;
  std::vector<const uint8_t*> at;
  for (int i = 0; i < 5; ++i) {
    blocks.push_back(cache.take(quarter));
    at.push_back(blocks.back().data.get());
  }
  for (AlignedBytes& b : blocks) cache.give(std::move(b));
  EXPECT_EQ(cache.kept_bytes(), 4 * quarter);  // the first one given back went
  std::vector<const uint8_t*> again;
  for (int i = 0; i < 4; ++i) again.push_back(cache.take(quarter).data.get());
  for (int i = 0; i < 4; ++i) EXPECT_EQ(again[i], at[1 + i]) << i;  // each fits as well
  // A block larger than the whole allowance is never kept.
  cache.give(cache.take(BufferCache::kKeptBytes + 64));
  EXPECT_EQ(cache.kept_bytes(), 0);
}

// Threads taking and giving at once never get one block twice.
TEST(BufferCache, ConcurrentCallsNeverShareABlock) {
  BufferCache cache;
  std::vector<std::thread> threads;
  std::vector<int> failures(4, 0);
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (int i = 0; i < 2000; ++i) {
        AlignedBytes b = cache.take(4096);
        for (int64_t k = 0; k < b.size; k += 512) b.data.get()[k] = static_cast<uint8_t>(t);
        std::this_thread::yield();
        for (int64_t k = 0; k < b.size; k += 512)
          if (b.data.get()[k] != static_cast<uint8_t>(t)) ++failures[t];
        cache.give(std::move(b));
      }
    });
  for (std::thread& t : threads) t.join();
  for (int t = 0; t < 4; ++t) EXPECT_EQ(failures[t], 0) << t;
  EXPECT_LE(cache.kept_bytes(), 4 * 4096);
}

}  // namespace
}  // namespace kiln::rt
