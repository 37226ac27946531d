// Batching many requests of different lengths (kiln translate on a whole file; the model
// server's concurrent requests): the requests are ordered by length and cut into batches
// whose padded size stays within a token budget and the model's max batch
// (group_by_length), and the batches run whole, each on one of N worker threads, the
// results handed back in the requests' order (run_batches, run_batched).
//
// The two halves are separate so that a caller that collects its requests over time (a
// server) can group what it holds with group_by_length and run the batches its own way.
//
// Threads: the kernels of every model library run on the runtime's one thread pool per
// process (thread_pool.h), whose loops run on the calling thread alone while another
// thread's loop holds it. A caller running W workers sets the kernel threads to its total
// divided by W (kiln_model_set_num_threads); with one kernel thread per worker every worker
// runs its kernels on its own thread, as CTranslate2's inter_threads do.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

namespace kiln::rt {

// What a batch may hold. A batch of R requests whose longest has length L costs
// R × (L + extra_per_row) tokens.
struct BatchLimits {
  int64_t max_batch_tokens = 0;  // the token budget of a batch (at least 1)
  int64_t max_batch_size = 0;    // requests in a batch at most (the model's max_batch); 0: any
  int64_t extra_per_row = 0;     // tokens counted for each row besides its length (e.g. the
                                 // longest target it may generate); at least 0
};

struct Batch {
  std::vector<size_t> requests;  // indices into the lengths given, shortest first
  int64_t length = 0;            // the longest request's length: the padded length
  // The tokens the batch costs: requests.size() × (length + extra_per_row).
  int64_t tokens = 0;
};

// Groups requests by length: orders them by length (a stable sort: equal lengths keep their
// order) and cuts that order into batches, each as long as it can be with its padded size
// (rows × (longest + extra_per_row)) within max_batch_tokens and its rows within
// max_batch_size. A request whose own size exceeds the budget runs in a batch of its own.
// Every request is in exactly one batch; the batches come shortest first. No requests: no
// batches. Lengths must be at least 0 and limits as documented (else std::invalid_argument).
std::vector<Batch> group_by_length(std::span<const int64_t> lengths, const BatchLimits& limits);

// The indices of `batches`, the most tokens first (equal ones in their order).
std::vector<size_t> batches_largest_first(const std::vector<Batch>& batches);

// An error a batch's function throws for one of its rows (its index within the batch), so
// that the error can name the request (BatchError::request).
class RowError : public std::runtime_error {
 public:
  RowError(size_t row, const std::string& message) : std::runtime_error(message), row(row) {}
  size_t row;
};

// A batch that failed in run_batched: the message of what its function threw (what()), the
// request that failed (its index in the input) where the function said which row (RowError),
// and the batch's requests.
class BatchError : public std::runtime_error {
 public:
  BatchError(const std::string& message, int64_t request, std::vector<size_t> requests)
      : std::runtime_error(message), request(request), requests(std::move(requests)) {}
  int64_t request;               // the failing request's index in the input, or -1: unknown
  std::vector<size_t> requests;  // the failing batch's requests
};

// Runs run(i) for every i in [0, count) on `workers` threads (the calling thread and
// workers - 1 more; at least 1, at most count are used), each i whole on one thread; the
// indices are handed out in order, so the caller puts its longest batches first to balance
// the threads. When a call throws, no more indices are handed out; once every started
// call has returned, the exception of the lowest failing index is rethrown.
void run_batches(size_t count, int workers, const std::function<void(size_t)>& run);

// group_by_length, then each batch run by run_one(batch) on `workers` threads (largest batches
// first), which returns one result per request of the batch, in the batch's order. Returns
// the results in the requests' order. What run_one throws comes back as a BatchError naming
// the request (a RowError's row) or -1, and the batch's requests; if several batches fail,
// the one that was handed out first.
template <typename Result>
std::vector<Result> run_batched(std::span<const int64_t> lengths, const BatchLimits& limits,
                                int workers,
                                const std::function<std::vector<Result>(const Batch&)>& run_one) {
  std::vector<Batch> batches = group_by_length(lengths, limits);
  std::vector<size_t> order = batches_largest_first(batches);
  std::vector<std::vector<Result>> results(batches.size());
  run_batches(order.size(), workers, [&](size_t i) {
    const Batch& batch = batches[order[i]];
    try {
      results[order[i]] = run_one(batch);
    } catch (const RowError& e) {
      const int64_t request =
          e.row < batch.requests.size() ? static_cast<int64_t>(batch.requests[e.row]) : -1;
      throw BatchError(e.what(), request, batch.requests);
    } catch (const BatchError&) {
      throw;
    } catch (const std::exception& e) {
      throw BatchError(e.what(), -1, batch.requests);
    }
    if (results[order[i]].size() != batch.requests.size())
      throw BatchError("a batch of " + std::to_string(batch.requests.size()) +
                           " requests returned " + std::to_string(results[order[i]].size()) +
                           " results",
                       -1, batch.requests);
  });
  std::vector<Result> out(lengths.size());
  for (size_t b = 0; b < batches.size(); ++b)
    for (size_t r = 0; r < batches[b].requests.size(); ++r)
      out[batches[b].requests[r]] = std::move(results[b][r]);
  return out;
}

}  // namespace kiln::rt
