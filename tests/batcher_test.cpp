// The runtime's batcher (runtime/batcher.h): grouping requests by length under a token
// budget and the model's max batch (every request exactly once, the budget kept, a too long
// request alone), and running the batches on worker threads with the results in the
// requests' order and a worker's error naming its request. Also run under ThreadSanitizer
// (concurrency_tests, scripts/test.sh).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "runtime/batcher.h"

namespace kiln::rt {
namespace {

std::vector<int64_t> random_lengths(size_t n, int64_t lo, int64_t hi, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int64_t> dist(lo, hi);
  std::vector<int64_t> out(n);
  for (int64_t& l : out) l = dist(rng);
  return out;
}

// Every request in exactly one batch, each batch's length its longest request's, its tokens
// rows × (length + extra), and the budget and max batch kept unless the batch is one request.
void check_grouping(const std::vector<int64_t>& lengths, const BatchLimits& limits,
                    const std::vector<Batch>& batches) {
  std::vector<int> seen(lengths.size(), 0);
  int64_t previous_length = -1;
  for (const Batch& b : batches) {
    ASSERT_FALSE(b.requests.empty());
    int64_t longest = 0;
    for (size_t r : b.requests) {
      ASSERT_LT(r, lengths.size());
      ++seen[r];
      longest = std::max(longest, lengths[r]);
    }
    EXPECT_EQ(b.length, longest);
    EXPECT_EQ(b.tokens,
              static_cast<int64_t>(b.requests.size()) * (b.length + limits.extra_per_row));
    if (b.requests.size() > 1) EXPECT_LE(b.tokens, limits.max_batch_tokens);
    if (limits.max_batch_size > 0)
      EXPECT_LE(static_cast<int64_t>(b.requests.size()), limits.max_batch_size);
    // Shortest first, within and across batches.
    for (size_t r = 1; r < b.requests.size(); ++r)
      EXPECT_LE(lengths[b.requests[r - 1]], lengths[b.requests[r]]);
    EXPECT_GE(lengths[b.requests.front()], previous_length);
    previous_length = b.length;
  }
  for (size_t i = 0; i < lengths.size(); ++i) EXPECT_EQ(seen[i], 1) << "request " << i;
}

TEST(Batcher, BudgetRespectedAndEveryRequestOnce) {
  for (unsigned seed = 0; seed < 20; ++seed) {
    const std::vector<int64_t> lengths = random_lengths(500 + seed * 37, 1, 80, seed);
    for (int64_t budget : {1, 79, 80, 81, 256, 1000, 4096, 1000000})
      for (int64_t extra : {0, 7}) {
        const BatchLimits limits{budget, 0, extra};
        std::vector<Batch> batches = group_by_length(lengths, limits);
        SCOPED_TRACE(testing::Message() << "seed " << seed << " budget " << budget);
        check_grouping(lengths, limits, batches);
        // Greedy: a batch could not have taken the next batch's first request.
        for (size_t b = 0; b + 1 < batches.size(); ++b) {
          const int64_t next = lengths[batches[b + 1].requests.front()] + extra;
          EXPECT_GT(static_cast<int64_t>(batches[b].requests.size() + 1) * next, budget);
        }
      }
  }
}

TEST(Batcher, ExactBudget) {
  // 10 requests of length 8 under 32 tokens: 4 + 4 + 2; with 2 extra tokens a row: 3 a batch.
  const std::vector<int64_t> lengths(10, 8);
  std::vector<Batch> b = group_by_length(lengths, {32, 0, 0});
  ASSERT_EQ(b.size(), 3u);
  EXPECT_EQ(b[0].requests, (std::vector<size_t>{0, 1, 2, 3}));
  EXPECT_EQ(b[1].requests, (std::vector<size_t>{4, 5, 6, 7}));
  EXPECT_EQ(b[2].requests, (std::vector<size_t>{8, 9}));
  EXPECT_EQ(b[0].tokens, 32);
  EXPECT_EQ(b[2].tokens, 16);
  b = group_by_length(lengths, {32, 0, 2});
  ASSERT_EQ(b.size(), 4u);
  EXPECT_EQ(b[0].tokens, 30);
  EXPECT_EQ(b[3].requests, (std::vector<size_t>{9}));
}

TEST(Batcher, SortsByLengthStably) {
  const std::vector<int64_t> lengths = {5, 1, 3, 1, 5, 2};
  std::vector<Batch> b = group_by_length(lengths, {1000, 0, 0});
  ASSERT_EQ(b.size(), 1u);
  EXPECT_EQ(b[0].requests, (std::vector<size_t>{1, 3, 5, 2, 0, 4}));
  EXPECT_EQ(b[0].length, 5);
  EXPECT_EQ(b[0].tokens, 30);
}

TEST(Batcher, MaxBatchRespected) {
  const std::vector<int64_t> lengths = random_lengths(1000, 1, 10, 42);
  for (int64_t max_batch : {1, 3, 32}) {
    const BatchLimits limits{1000000, max_batch, 0};
    std::vector<Batch> batches = group_by_length(lengths, limits);
    check_grouping(lengths, limits, batches);
    EXPECT_EQ(batches.size(), (lengths.size() + max_batch - 1) / max_batch);
  }
}

TEST(Batcher, OverlongRequestRunsAlone) {
  // 100 tokens over a budget of 50: alone; the short ones around it still share batches.
  const std::vector<int64_t> lengths = {10, 100, 10, 10, 60};
  std::vector<Batch> b = group_by_length(lengths, {50, 0, 0});
  ASSERT_EQ(b.size(), 3u);
  EXPECT_EQ(b[0].requests, (std::vector<size_t>{0, 2, 3}));
  EXPECT_EQ(b[1].requests, (std::vector<size_t>{4}));
  EXPECT_EQ(b[1].tokens, 60);
  EXPECT_EQ(b[2].requests, (std::vector<size_t>{1}));
  EXPECT_EQ(b[2].tokens, 100);
  // The same with a budget of 1: every request alone.
  EXPECT_EQ(group_by_length(lengths, {1, 0, 0}).size(), lengths.size());
}

TEST(Batcher, EmptyInput) {
  EXPECT_TRUE(group_by_length(std::vector<int64_t>{}, {10, 4, 0}).empty());
  int calls = 0;
  run_batches(0, 4, [&](size_t) { ++calls; });
  EXPECT_EQ(calls, 0);
  const std::vector<int> out = run_batched<int>(std::vector<int64_t>{}, {10, 4, 0}, 2,
                                                [&](const Batch&) -> std::vector<int> {
                                                  ++calls;
                                                  return {};
                                                });
  EXPECT_TRUE(out.empty());
  EXPECT_EQ(calls, 0);
}

TEST(Batcher, ZeroLengthRequests) {
  const std::vector<int64_t> lengths = {0, 0, 3};
  std::vector<Batch> b = group_by_length(lengths, {4, 0, 0});
  check_grouping(lengths, {4, 0, 0}, b);
  ASSERT_EQ(b.size(), 2u);
  EXPECT_EQ(b[0].requests, (std::vector<size_t>{0, 1}));
  EXPECT_EQ(b[0].tokens, 0);
}

TEST(Batcher, BadLimitsRefused) {
  const std::vector<int64_t> lengths = {1, 2};
  auto message = [&](const BatchLimits& limits) {
    try {
      group_by_length(lengths, limits);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(message({0, 0, 0}), "max_batch_tokens must be at least 1, got 0");
  EXPECT_EQ(message({-5, 0, 0}), "max_batch_tokens must be at least 1, got -5");
  EXPECT_EQ(message({10, -1, 0}), "max_batch_size must be at least 0, got -1");
  EXPECT_EQ(message({10, 0, -1}), "extra_per_row must be in [0, 2^61), got -1");
  const std::vector<int64_t> negative = {1, -3};
  try {
    group_by_length(negative, {10, 0, 0});
    FAIL() << "no error";
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(), "request 1 has length -3");
  }
  EXPECT_THROW(run_batches(3, 0, [](size_t) {}), std::invalid_argument);
}

// run_batched: results in the requests' order whatever the grouping and the workers, each
// request computed once, every batch whole on one thread.
TEST(Batcher, OrderRestoredOnWorkers) {
  const std::vector<int64_t> lengths = random_lengths(2000, 1, 80, 7);
  for (int workers : {1, 2, 3, 8})
    for (int64_t budget : {50, 600, 5000}) {
      std::atomic<int> calls{0};
      std::mutex mutex;
      std::set<std::thread::id> threads;
      std::vector<int> computed(lengths.size(), 0);
      const std::vector<std::string> out =
          run_batched<std::string>(lengths, {budget, 32, 0}, workers, [&](const Batch& b) {
            ++calls;
            const std::thread::id me = std::this_thread::get_id();
            std::vector<std::string> r;
            for (size_t i : b.requests) {
              EXPECT_EQ(std::this_thread::get_id(), me);
              r.push_back(std::to_string(i) + ":" + std::to_string(lengths[i]));
            }
            std::lock_guard lock(mutex);
            threads.insert(me);
            for (size_t i : b.requests) ++computed[i];
            return r;
          });
      ASSERT_EQ(out.size(), lengths.size());
      for (size_t i = 0; i < lengths.size(); ++i) {
        EXPECT_EQ(out[i], std::to_string(i) + ":" + std::to_string(lengths[i]));
        EXPECT_EQ(computed[i], 1) << "request " << i;
      }
      EXPECT_EQ(calls.load(), static_cast<int>(group_by_length(lengths, {budget, 32, 0}).size()));
      EXPECT_LE(threads.size(), static_cast<size_t>(workers));
    }
}

// Several workers really run at once: with 2 workers, two batches are in flight together.
TEST(Batcher, WorkersRunConcurrently) {
  std::atomic<int> in_flight{0}, most{0};
  run_batches(8, 2, [&](size_t) {
    const int now = ++in_flight;
    int m = most.load();
    while (now > m && !most.compare_exchange_weak(m, now)) {
    }
    // Wait (bounded) for the other worker to arrive.
    for (int spin = 0; spin < 2000 && most.load() < 2; ++spin)
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    --in_flight;
  });
  EXPECT_EQ(most.load(), 2);
}

// Largest batches are handed out first.
TEST(Batcher, LargestBatchesFirst) {
  std::vector<Batch> batches(4);
  batches[0].tokens = 10;
  batches[1].tokens = 40;
  batches[2].tokens = 10;
  batches[3].tokens = 25;
  EXPECT_EQ(batches_largest_first(batches), (std::vector<size_t>{1, 3, 0, 2}));
  std::vector<size_t> order;
  run_batches(5, 1, [&](size_t i) { order.push_back(i); });
  EXPECT_EQ(order, (std::vector<size_t>{0, 1, 2, 3, 4}));
}

// A row's error names its request (the index in the input); any other error the batch's
// requests; later batches are not started once one failed (one worker: in order).
TEST(Batcher, WorkerErrorNamesTheRequest) {
  const std::vector<int64_t> lengths = {4, 9, 2, 7, 9, 1};
  for (int workers : {1, 2}) {
    try {
      run_batched<int>(lengths, {9, 0, 0}, workers, [&](const Batch& b) {
        std::vector<int> r;
        for (size_t row = 0; row < b.requests.size(); ++row) {
          if (b.requests[row] == 3) throw RowError(row, "row broke");
          r.push_back(0);
        }
        return r;
      });
      FAIL() << "no error";
    } catch (const BatchError& e) {
      EXPECT_STREQ(e.what(), "row broke");
      EXPECT_EQ(e.request, 3);
      EXPECT_EQ(e.requests, (std::vector<size_t>{3}));
    }
  }
  try {
    run_batched<int>(lengths, {1000, 0, 0}, 2, [&](const Batch&) -> std::vector<int> {
      throw std::runtime_error("device lost");
    });
    FAIL() << "no error";
  } catch (const BatchError& e) {
    EXPECT_STREQ(e.what(), "device lost");
    EXPECT_EQ(e.request, -1);
    EXPECT_EQ(e.requests, (std::vector<size_t>{5, 2, 0, 3, 1, 4}));
  }
  // A wrong number of results is an error, not a silent hole.
  try {
    run_batched<int>(lengths, {1000, 0, 0}, 1, [&](const Batch&) {
      return std::vector<int>{1, 2};
    });
    FAIL() << "no error";
  } catch (const BatchError& e) {
    EXPECT_STREQ(e.what(), "a batch of 6 requests returned 2 results");
  }
  // One worker stops at the first failure; the lowest failing index is the one reported.
  std::vector<size_t> ran;
  try {
    run_batches(6, 1, [&](size_t i) {
      ran.push_back(i);
      if (i >= 2) throw std::runtime_error("batch " + std::to_string(i));
    });
    FAIL() << "no error";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "batch 2");
  }
  EXPECT_EQ(ran, (std::vector<size_t>{0, 1, 2}));
  for (int round = 0; round < 20; ++round) {
    try {
      run_batches(40, 3, [&](size_t i) {
        if (i % 7 == 5) throw std::runtime_error("batch " + std::to_string(i));
      });
      FAIL() << "no error";
    } catch (const std::runtime_error& e) {
      EXPECT_STREQ(e.what(), "batch 5");  // index 5 is handed out before 12, 19, ...
    }
  }
}

}  // namespace
}  // namespace kiln::rt
