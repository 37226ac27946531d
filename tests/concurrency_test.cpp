// One compiled model object used from many threads at once (the promise in
// kiln/runtime.h): every call's result is bitwise identical to the same call made alone,
// and each thread sees its own errors. The suite also runs this file under
// ThreadSanitizer (scripts/test.sh).
#include <atomic>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "golden_tiny.h"

namespace kiln {
namespace {

std::string golden(const std::string& f) {
  return std::string(KILN_TEST_DATA_DIR) + "/golden/" + f;
}

// Ids of a [batch, len] input, varying with `seed`, in tiny's vocabulary (pad 0 at the
// tail of every other row).
kiln::Tensor<int64_t> ids(int64_t batch, int64_t len, int64_t seed) {
  kiln::Tensor<int64_t> t{{batch, len}, {}};
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t i = 0; i < len; ++i)
      t.data.push_back(b % 2 && i > len / 2 ? 0 : 1 + (seed * 31 + b * 7 + i * 13) % 36);
  return t;
}

// A call: forward or encode on one batch and length.
struct Call {
  bool forward;
  kiln::Tensor<int64_t> src, tgt;
};

std::vector<Call> mixed_calls() {
  std::vector<Call> calls;
  int64_t seed = 0;
  for (int64_t batch : {1, 2, 4})
    for (int64_t len : {1, 5, 17, 40}) {
      ++seed;
      calls.push_back(
          {true, ids(batch, len, seed), ids(batch, std::max<int64_t>(1, len / 2), seed)});
      calls.push_back({false, ids(batch, len, seed + 100), {}});
    }
  return calls;
}

void run(kiln_models::golden_tiny& model, const Call& c, kiln::Tensor<float>& out) {
  if (c.forward)
    model.forward(c.src, c.tgt, out);
  else
    model.encode(c.src, out);
}

// 8 threads × 1000 calls on one object, on 24 mixed shapes, some calls bad (an id out of
// range; an output overlapping its input, refused untouched): every good result equals the
// single-threaded one bit for bit, every bad call gets its own error.
TEST(Concurrency, OneModelFromEightThreadsMatchesSingleThreadedBitwise) {
  kiln_models::golden_tiny model(golden("tiny.weights.safetensors").c_str());
  model.set_num_threads(2);
  const std::vector<Call> calls = mixed_calls();
  std::vector<kiln::Tensor<float>> want(calls.size());
  for (size_t i = 0; i < calls.size(); ++i) run(model, calls[i], want[i]);

  // An output overlapping its input (through the C ABI): [1,3] ids, the output from byte 8 on.
  kiln_tensor alias_in{}, alias_out{};
  alias_in.name = "src";
  alias_in.dtype = KILN_I64;
  alias_in.rank = 2;
  alias_in.shape[0] = 1;
  alias_in.shape[1] = 3;
  alias_in.capacity = 24;
  const std::vector<int64_t> ones(3, 1);
  alias_in.data = const_cast<int64_t*>(ones.data());
  ASSERT_EQ(kiln_model_output_shapes(model.get(), "encode", &alias_in, 1, &alias_out, 1), 0)
      << kiln_model_error(model.get());
  size_t out_bytes = 4;
  for (int32_t d = 0; d < alias_out.rank; ++d) out_bytes *= static_cast<size_t>(alias_out.shape[d]);
  const std::string alias_error =
      std::string("output '") + alias_out.name +
      "' overlaps input 'src' (its bytes [0, 16) are bytes [8, 24) of 'src'): an output must "
      "not share memory with an input or another output (a cache updated in place is the one "
      "exception)";

  constexpr int kThreads = 8, kCallsPerThread = 1000;
  std::atomic<int> mismatches{0}, wrong_errors{0}, done{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      kiln::Tensor<float> out;
      const kiln::Tensor<int64_t> bad{{1, 3}, {1, 99, 2}};  // 99 is outside tiny's 37 ids
      std::vector<int64_t> shared(1 + out_bytes / 8, 1);    // this thread's ids and output
      for (int i = 0; i < kCallsPerThread; ++i) {
        const size_t k = static_cast<size_t>(t * 7 + i * 5) % calls.size();
        if (i % 100 == 75) {  // every other bad call: refused for the overlap, nothing written
          kiln_tensor in = alias_in, o = alias_out;
          in.data = shared.data();
          o.data = shared.data() + 1;
          o.capacity = out_bytes;
          if (kiln_model_run(model.get(), "encode", &in, 1, &o, 1) == 0 ||
              kiln_model_error(model.get()) != alias_error ||
              shared != std::vector<int64_t>(shared.size(), 1))
            ++wrong_errors;
          continue;
        }
        if (i % 50 == 25) {  // a bad call now and then: its error is this thread's
          try {
            model.encode(bad, out);
            ++wrong_errors;
          } catch (const std::exception& e) {
            if (std::string(e.what()) != "token id 99 at 'src'[0,1] is out of range [0, 37)")
              ++wrong_errors;
          }
          continue;
        }
        run(model, calls[k], out);
        if (out.shape != want[k].shape || out.data != want[k].data) ++mismatches;
        ++done;
      }
      if (kiln_model_error(model.get())[0] != '\0') ++wrong_errors;  // the last call was good
    });
  for (std::thread& th : threads) th.join();
  std::printf("[ threads  ] %d good calls from %d threads, %d mismatches, %d wrong errors\n",
              done.load(), kThreads, mismatches.load(), wrong_errors.load());
  EXPECT_EQ(done.load(), kThreads * (kCallsPerThread - kCallsPerThread / 50));
  EXPECT_EQ(mismatches.load(), 0);
  EXPECT_EQ(wrong_errors.load(), 0);
}

// Profiling while several threads run counts every run once.
TEST(Concurrency, ProfilingCountsEveryConcurrentRun) {
  kiln_models::golden_tiny model(golden("tiny.weights.safetensors").c_str());
  model.set_profiling(true);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&] {
      for (int i = 0; i < 25; ++i) model.encode(ids(1, 3, i));
    });
  for (std::thread& th : threads) th.join();
  const std::string report = model.profile();
  EXPECT_NE(report.find("kiln profile: 'encode' ran 100 time(s)"), std::string::npos) << report;
}

}  // namespace
}  // namespace kiln
