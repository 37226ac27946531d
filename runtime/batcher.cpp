// Grouping requests by length under a token budget, and running batches on worker threads
// (batcher.h).
#include "runtime/batcher.h"

#include <algorithm>
#include <atomic>
#include <exception>
#include <limits>
#include <mutex>
#include <numeric>
#include <system_error>
#include <thread>

namespace kiln::rt {

std::vector<Batch> group_by_length(std::span<const int64_t> lengths, const BatchLimits& limits) {
  if (limits.max_batch_tokens < 1)
    throw std::invalid_argument("max_batch_tokens must be at least 1, got " +
                                std::to_string(limits.max_batch_tokens));
  if (limits.max_batch_size < 0)
    throw std::invalid_argument("max_batch_size must be at least 0, got " +
                                std::to_string(limits.max_batch_size));
  constexpr int64_t kMaxLength = std::numeric_limits<int64_t>::max() / 4;
  if (limits.extra_per_row < 0 || limits.extra_per_row > kMaxLength)
    throw std::invalid_argument("extra_per_row must be in [0, 2^61), got " +
                                std::to_string(limits.extra_per_row));
  for (size_t i = 0; i < lengths.size(); ++i)
    if (lengths[i] < 0 || lengths[i] > kMaxLength - limits.extra_per_row)
      throw std::invalid_argument("request " + std::to_string(i) + " has length " +
                                  std::to_string(lengths[i]));

  std::vector<size_t> order(lengths.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return lengths[a] < lengths[b]; });

  std::vector<Batch> batches;
  Batch current;
  for (size_t i : order) {
    // Lengths ascend: the new request is the batch's longest.
    const int64_t row = lengths[i] + limits.extra_per_row;
    const int64_t rows = static_cast<int64_t>(current.requests.size()) + 1;
    const bool full = limits.max_batch_size > 0 && rows > limits.max_batch_size;
    // rows × row without overflow: row <= INT64_MAX / 4 and rows <= the number of requests.
    const bool over = row > 0 && rows > limits.max_batch_tokens / row;
    if (!current.requests.empty() && (full || over)) {
      batches.push_back(std::move(current));
      current = Batch{};
    }
    current.requests.push_back(i);
    current.length = lengths[i];
    current.tokens = static_cast<int64_t>(current.requests.size()) * row;
  }
  if (!current.requests.empty()) batches.push_back(std::move(current));
  return batches;
}

std::vector<size_t> batches_largest_first(const std::vector<Batch>& batches) {
  std::vector<size_t> order(batches.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return batches[a].tokens > batches[b].tokens; });
  return order;
}

void run_batches(size_t count, int workers, const std::function<void(size_t)>& run) {
  if (workers < 1)
    throw std::invalid_argument("workers must be at least 1, got " + std::to_string(workers));
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  std::mutex mutex;  // guards first_error and first_index
  std::exception_ptr first_error;
  size_t first_index = count;
  auto work = [&] {
    for (;;) {
      if (failed.load()) return;
      const size_t i = next.fetch_add(1);
      if (i >= count) return;
      try {
        run(i);
      } catch (...) {
        std::lock_guard lock(mutex);
        if (i < first_index) {
          first_index = i;
          first_error = std::current_exception();
        }
        failed.store(true);
      }
    }
  };
  const size_t threads = std::min<size_t>(static_cast<size_t>(workers), count);
  std::vector<std::thread> extra;
  for (size_t t = 1; t < threads; ++t) {
    try {
      extra.emplace_back(work);
    } catch (const std::system_error&) {
      break;  // no more threads: the ones started (and this one) run every batch
    }
  }
  work();
  for (std::thread& t : extra) t.join();
  if (first_error) std::rethrow_exception(first_error);
}

}  // namespace kiln::rt
