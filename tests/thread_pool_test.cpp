// The runtime's thread pool (runtime/thread_pool.h): every index of a loop runs exactly
// once, whichever thread runs it; each thread runs its own range of the indices first; the first
// failure is returned and stops the tasks not yet started; loops from many threads at once, loops
// inside loops and a change of the thread count in between all give the same results. Also run
// under ThreadSanitizer (concurrency_tests, scripts/test.sh).
#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "runtime/thread_pool.h"

namespace kiln::rt {
namespace {

struct Counts {
  std::vector<std::atomic<int>> runs;
  std::atomic<int> threads_seen{0};
  explicit Counts(int n) : runs(n) {}
};

int count_task(void*, int i, uint8_t* closure) {
  auto* c = reinterpret_cast<Counts*>(closure);
  c->runs[i].fetch_add(1);
  return 0;
}

// Each index runs exactly once, over many loops of different sizes and offsets.
TEST(ThreadPool, EveryIndexRunsOnce) {
  pool_set_threads(2);
  for (int size : {0, 1, 2, 3, 7, 64, 1000}) {
    for (int min : {0, 5}) {
      Counts c(min + size);
      ASSERT_EQ(pool_par_for(nullptr, count_task, min, size, reinterpret_cast<uint8_t*>(&c)), 0);
      for (int i = 0; i < min + size; ++i)
        EXPECT_EQ(c.runs[i].load(), i < min ? 0 : 1) << "size " << size << " index " << i;
    }
  }
}

// Each thread runs a contiguous range of the indices first, in order (thread_pool.h; the
// linears that prefetch the next task's weights rely on it): with 2 threads and 4 indices the
// caller runs 0 and 1, the worker 2 and 3. Indices 0 and 2 wait for each other, as do 1 and 3,
// so that neither thread can take the other's second index; claimed one at a time from a
// shared counter (0 and 1 first) they would wait in vain and fail.
struct Pairs {
  std::atomic<int> arrived[2] = {0, 0};
  std::thread::id by[4];
};

int pair_task(void*, int i, uint8_t* closure) {
  auto* p = reinterpret_cast<Pairs*>(closure);
  p->by[i] = std::this_thread::get_id();
  std::atomic<int>& arrived = p->arrived[i % 2];
  arrived.fetch_add(1);
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (arrived.load() < 2)
    if (std::chrono::steady_clock::now() > until) return 1;  // fail instead of hanging
  return 0;
}

TEST(ThreadPool, EachThreadRunsItsOwnRangeInOrder) {
  pool_set_threads(2);
  for (int round = 0; round < 20; ++round) {
    Pairs p;
    ASSERT_EQ(pool_par_for(nullptr, pair_task, 0, 4, reinterpret_cast<uint8_t*>(&p)), 0)
        << "round " << round;
    EXPECT_EQ(p.by[0], std::this_thread::get_id());
    EXPECT_EQ(p.by[1], std::this_thread::get_id());
    EXPECT_NE(p.by[2], std::this_thread::get_id());
    EXPECT_EQ(p.by[3], p.by[2]);
  }
}

// With 2 threads, a loop whose tasks wait for each other completes only if both threads
// run its tasks: the pool's worker really takes part.
int rendezvous_task(void*, int, uint8_t* closure) {
  auto* arrived = reinterpret_cast<std::atomic<int>*>(closure);
  arrived->fetch_add(1);
  for (long spins = 0; arrived->load() < 2; ++spins)
    if (spins > 2'000'000'000L) return 1;  // alone: fail instead of hanging
  return 0;
}

TEST(ThreadPool, TwoThreadsRunTasksAtOnce) {
  pool_set_threads(2);
  for (int round = 0; round < 20; ++round) {
    std::atomic<int> arrived{0};
    EXPECT_EQ(pool_par_for(nullptr, rendezvous_task, 0, 2, reinterpret_cast<uint8_t*>(&arrived)),
              0);
  }
}

int fail_at_3(void*, int i, uint8_t* closure) {
  reinterpret_cast<std::atomic<int>*>(closure)->fetch_add(1);
  return i == 3 ? -7 : 0;
}

TEST(ThreadPool, FirstFailureIsReturned) {
  pool_set_threads(2);
  std::atomic<int> ran{0};
  EXPECT_EQ(pool_par_for(nullptr, fail_at_3, 0, 10000, reinterpret_cast<uint8_t*>(&ran)), -7);
  EXPECT_LT(ran.load(), 10000);  // the tasks after the failure were skipped
  // The pool is usable again.
  Counts c(100);
  EXPECT_EQ(pool_par_for(nullptr, count_task, 0, 100, reinterpret_cast<uint8_t*>(&c)), 0);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(c.runs[i].load(), 1);
}

// A loop inside a task runs (serially) and completes.
int nested_task(void*, int, uint8_t* closure) {
  auto* c = reinterpret_cast<Counts*>(closure);
  Counts inner(16);
  if (pool_par_for(nullptr, count_task, 0, 16, reinterpret_cast<uint8_t*>(&inner)) != 0) return 1;
  for (int i = 0; i < 16; ++i)
    if (inner.runs[i].load() != 1) return 2;
  c->threads_seen.fetch_add(1);
  return 0;
}

TEST(ThreadPool, LoopInsideALoop) {
  pool_set_threads(2);
  Counts c(0);
  EXPECT_EQ(pool_par_for(nullptr, nested_task, 0, 40, reinterpret_cast<uint8_t*>(&c)), 0);
  EXPECT_EQ(c.threads_seen.load(), 40);
}

// Loops from 6 threads at once (one gets the pool, the others run serially), with the
// thread count changed in between.
TEST(ThreadPool, ManyCallersAndThreadCountChanges) {
  std::atomic<int> bad{0};
  std::vector<std::thread> callers;
  for (int t = 0; t < 6; ++t)
    callers.emplace_back([&, t] {
      for (int round = 0; round < 200; ++round) {
        if (t == 0 && round % 50 == 0) pool_set_threads(1 + round / 50 % 3);
        const int size = 1 + (round * 7 + t) % 50;
        Counts c(size);
        if (pool_par_for(nullptr, count_task, 0, size, reinterpret_cast<uint8_t*>(&c)) != 0)
          bad.fetch_add(1);
        for (int i = 0; i < size; ++i)
          if (c.runs[i].load() != 1) bad.fetch_add(1);
      }
    });
  for (std::thread& t : callers) t.join();
  EXPECT_EQ(bad.load(), 0);
  pool_set_threads(2);
  EXPECT_EQ(pool_threads(), 2);
}

}  // namespace
}  // namespace kiln::rt
