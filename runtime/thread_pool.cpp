// The runtime's thread pool (thread_pool.h).
//
// A loop is published in the pool's fields and made visible by the job counter `gen_`:
// odd while the caller writes the fields, even once they are complete. A worker announces
// itself in `active_` and then re-reads `gen_`; the caller, after making `gen_` odd, waits
// for `active_` to drop to 0 before it writes. So a worker reads the fields of exactly
// the loop it joined, and a late worker of a finished loop finds its indices used up
// and leaves without calling anything. The indices are cut into one contiguous range per
// thread (`ranges_`, the caller's first); a thread claims the indices of its own range one
// at a time, in order, then those left in the others' ranges (from their fronts, the next
// range first); the caller waits for `done_` to reach the loop's size.
#include "runtime/thread_pool.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <vector>

namespace kiln::rt {
namespace {

void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#else
  std::this_thread::yield();
#endif
}

int env_int(const char* name, int fallback, int lo, int hi) {
  const char* s = std::getenv(name);
  if (!s || !*s) return fallback;
  char* end = nullptr;
  long v = std::strtol(s, &end, 10);
  if (*end || v < lo || v > hi) return fallback;
  return static_cast<int>(v);
}

// True on the pool's workers and on a caller while it runs tasks: a loop started there
// runs serially.
thread_local bool tl_in_task = false;

class Pool {
 public:
  Pool()
      : threads_(env_int("HL_NUM_THREADS",
                         std::max(1, static_cast<int>(std::thread::hardware_concurrency())), 1,
                         kMaxThreads)),
        spin_(std::chrono::microseconds(env_int("KILN_SPIN_US", 1000, 0, 1000000))) {}

  int run(void* uc, ParTask task, int min, int size, uint8_t* closure) {
    if (size <= 0) return 0;
    if (size == 1 || tl_in_task || threads_.load() <= 1)
      return serial(uc, task, min, size, closure);
    std::unique_lock owner(owner_, std::try_to_lock);
    if (!owner.owns_lock()) return serial(uc, task, min, size, closure);
    start_workers();
    const uint32_t g = gen_.load();
    gen_.store(g + 1);  // odd: the fields are being written
    while (active_.load() != 0) cpu_relax();
    task_ = task;
    uc_ = uc;
    closure_ = closure;
    error_.store(0, std::memory_order_relaxed);
    done_.store(0, std::memory_order_relaxed);
    parts_ = std::min(threads_.load(), size);
    for (int p = 0; p < parts_; ++p) {
      ranges_[p].next.store(min + static_cast<int>(int64_t{size} * p / parts_),
                            std::memory_order_relaxed);
      ranges_[p].end = min + static_cast<int>(int64_t{size} * (p + 1) / parts_);
    }
    gen_.store(g + 2);
    gen_.notify_all();
    tl_in_task = true;
    work(0);
    tl_in_task = false;
    while (done_.load(std::memory_order_acquire) != size) cpu_relax();
    return error_.load(std::memory_order_relaxed);
  }

  void set_threads(int n) {
    std::lock_guard owner(owner_);
    n = std::max(1, std::min(n, kMaxThreads));
    if (n == threads_.load()) return;
    stop_workers();
    threads_.store(n);
  }

  int threads() const { return threads_.load(); }

 private:
  static int serial(void* uc, ParTask task, int min, int size, uint8_t* closure) {
    const bool outer = tl_in_task;
    tl_in_task = true;
    int result = 0;
    for (int i = min; i < min + size && result == 0; ++i) result = task(uc, i, closure);
    tl_in_task = outer;
    return result;
  }

  // The next index for thread `self` (0: the caller; a worker, its number), or -1 when
  // every range is used up.
  int claim(int self) {
    for (int k = 0; k < parts_; ++k) {
      Range& r = ranges_[(self + k) % parts_];
      if (r.next.load(std::memory_order_relaxed) >= r.end) continue;
      const int i = r.next.fetch_add(1, std::memory_order_relaxed);
      if (i < r.end) return i;
    }
    return -1;
  }

  // Claims and runs indices until there are none left.
  void work(int self) {
    for (;;) {
      const int i = claim(self);
      if (i < 0) return;
      if (error_.load(std::memory_order_relaxed) == 0) {
        const int r = task_(uc_, i, closure_);
        int none = 0;
        if (r != 0) error_.compare_exchange_strong(none, r, std::memory_order_relaxed);
      }
      done_.fetch_add(1, std::memory_order_release);
    }
  }

  void worker(uint32_t seen, int self) {
    tl_in_task = true;
    for (;;) {
      uint32_t g = gen_.load();
      if (g == seen || (g & 1)) {
        const auto until = std::chrono::steady_clock::now() + spin_;
        for (int n = 1;; ++n) {
          cpu_relax();
          g = gen_.load(std::memory_order_relaxed);
          if (g != seen && !(g & 1)) break;
          if (n % 64 == 0 && std::chrono::steady_clock::now() >= until) {
            gen_.wait(g);
            break;
          }
        }
        continue;
      }
      if (stop_.load()) return;
      active_.fetch_add(1);
      if (gen_.load() == g) {
        seen = g;
        work(self);
      }
      active_.fetch_sub(1);
    }
  }

  // Under owner_.
  void start_workers() {
    if (!workers_.empty()) return;
    stop_.store(false);
    for (int i = 1; i < threads_.load(); ++i)
      workers_.emplace_back([this, g = gen_.load(), i] { worker(g, i); });
  }

  // Under owner_.
  void stop_workers() {
    if (workers_.empty()) return;
    stop_.store(true);
    gen_.fetch_add(2);
    gen_.notify_all();
    for (std::thread& t : workers_) t.join();
    workers_.clear();
  }

  std::mutex owner_;  // held by the loop in flight (try_lock: a busy pool runs serially)
  std::atomic<int> threads_;
  const std::chrono::microseconds spin_;
  std::vector<std::thread> workers_;
  std::atomic<bool> stop_{false};

  std::atomic<uint32_t> gen_{0};
  std::atomic<int> active_{0};
  std::atomic<int> done_{0};
  std::atomic<int> error_{0};
  ParTask task_ = nullptr;
  void* uc_ = nullptr;
  uint8_t* closure_ = nullptr;
  // One range of indices per thread of the loop (at most one per index), each on its own
  // cache line.
  struct alignas(64) Range {
    std::atomic<int> next{0};
    int end = 0;
  };
  static constexpr int kMaxThreads = 256;  // pool_set_threads' bound
  Range ranges_[kMaxThreads];
  int parts_ = 0;
};

// Never destroyed: its workers may still be parked when the process exits.
Pool& pool() {
  static Pool* p = new Pool;
  return *p;
}

}  // namespace

int pool_par_for(void* user_context, ParTask task, int min, int size, uint8_t* closure) {
  return pool().run(user_context, task, min, size, closure);
}

void pool_set_threads(int threads) { pool().set_threads(threads); }

int pool_threads() { return pool().threads(); }

}  // namespace kiln::rt
