// Generation over a compiled model (see kiln/runtime.h, kiln_generate and kiln_generator_*):
// the runtime's search code, in C++ for the C entry points in c_api.cpp.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "kiln/runtime.h"

namespace kiln::rt {

struct Generation {
  int64_t batch = 0, hypotheses = 0, max_length = 0;
  std::vector<int64_t> ids;      // [batch, hypotheses, max_length], -1 padded
  std::vector<int64_t> lengths;  // [batch, hypotheses]
  std::vector<float> scores;     // [batch, hypotheses]
};

// Throws kiln::Error naming the problem with the options or the input.
Generation generate(kiln_model* model, const kiln_tensor& src, const kiln_search_options& options);

class Search;

// A generation that sentences join at step boundaries (continuous batching; generate.cpp
// says when they fit). One caller at a time. Throws kiln::Error; a failure while running the
// model leaves it unusable (every later call says so).
class Generator {
 public:
  Generator(kiln_model* model, const kiln_search_options& options);
  ~Generator();
  // Adds the sentences of `src` (as kiln_generate takes them), each decoding at most
  // `max_decoding_length` tokens (0: the options'): the id of the first (the others follow),
  // or nothing when they cannot join now.
  std::optional<int64_t> add(const kiln_tensor& src, int32_t max_decoding_length = 0);
  // Every live hypothesis one token further (on_token reports the tokens by sentence id).
  void step();
  // Ends sentence `id` now: it leaves the batch, finished with what it has finished.
  void cancel(int64_t id);
  int64_t alive() const;  // sentences not finished
  // The sentences finished since the last call, by id.
  std::vector<int64_t> take_finished();
  // A finished sentence's hypotheses (batch 1); what it held is freed.
  Generation result(int64_t id);

 private:
  void check_usable() const;
  std::unique_ptr<Search> search_;
  std::vector<char> taken_;  // by id: result() given
  bool broken_ = false;
};

}  // namespace kiln::rt
