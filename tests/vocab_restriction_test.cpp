// Vocabulary restriction (kiln_search_options.vocabulary, over nn::add_seq2seq's
// decode_step_restricted) on the compiled golden tiny model:
//  - restricted to every id (shuffled, with duplicates), greedy, beam search and sampling give
//    the unrestricted ids, the scores within float rounding;
//  - restricted to a subset, they give the ids and scores of the unrestricted search over the
//    full logits with every other token's logit -inf: the reference runs the model with
//    generator.bias -inf at those tokens (the existing search over decode_step), and the
//    subset is chosen so that the result differs from the unrestricted one;
//  - the generator (kiln_generator_*) restricts every sentence as kiln_generate does, and
//    on_token and min_decoding_length see token ids;
//  - bad restrictions and a library without decode_step_restricted are refused with the
//    reason (a decoder-only model: causal_lm_test.cpp).
#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "error_of.h"
#include "golden_checks.h"
#include "golden_tiny.h"
#include "runtime/safetensors.h"
#include "unrestricted_tiny.h"

namespace kiln {
namespace {

using Hyps = std::vector<std::vector<kiln::Hypothesis>>;

constexpr int64_t kVocab = 41;  // the tiny config's tgt_vocab
// Scores are sums of log-probabilities over a few tokens; the restricted step's log-softmax
// is over fewer (or the same) logits, summed in another order.
constexpr double kScoreTolerance = 1e-4;

std::string golden(const std::string& f) { return testing::golden_file(f); }

std::string error_of(const std::function<void()>& fn) {
  return testing::error_of<std::exception>(fn);
}

// The golden tiny weights with generator.bias -inf at every token outside `allowed`: its
// unrestricted search is the search over the full logits with those tokens masked to -inf.
std::unique_ptr<kiln_models::golden_tiny> masked_model(const std::set<int64_t>& allowed) {
  const rt::SafeTensors tiny = rt::SafeTensors::load(golden("tiny.weights.safetensors"));
  std::vector<rt::TensorData> out;
  for (const rt::TensorInfo& t : tiny.tensors()) {
    std::vector<float> v = tiny.to_f32(t);
    if (t.name == "generator.bias") {
      EXPECT_EQ(v.size(), static_cast<size_t>(kVocab));
      for (int64_t id = 0; id < kVocab; ++id)
        if (!allowed.count(id))
          v[static_cast<size_t>(id)] = -std::numeric_limits<float>::infinity();
    }
    out.push_back(rt::make_f32(t.name, t.shape, v));
  }
  const std::string path = ::testing::TempDir() + "vocab_restriction_masked.safetensors";
  rt::write_safetensors(path, out, tiny.metadata());
  return std::make_unique<kiln_models::golden_tiny>(path.c_str());
}

kiln::Tensor<int64_t> sources() {
  // Three sentences, the last two padded (pad_id 0).
  return {{3, 6}, {3, 4, 5, 6, 7, 8, 9, 10, 11, 0, 0, 0, 12, 13, 14, 15, 0, 0}};
}

kiln::SearchOptions options(int32_t beam, int32_t hypotheses) {
  kiln::SearchOptions o;
  o.beam_size = beam;
  o.num_hypotheses = hypotheses;
  o.max_decoding_length = 12;
  return o;
}

void restrict_to(kiln::SearchOptions& o, const std::vector<int64_t>& ids) {
  o.vocabulary = ids.data();
  o.num_vocabulary = static_cast<int32_t>(ids.size());
}

// The same ids, and scores within kScoreTolerance.
void expect_same(const Hyps& got, const Hyps& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t s = 0; s < got.size(); ++s) {
    ASSERT_EQ(got[s].size(), want[s].size()) << what << ", sentence " << s;
    for (size_t h = 0; h < got[s].size(); ++h) {
      EXPECT_EQ(got[s][h].ids, want[s][h].ids) << what << ", sentence " << s << " hyp " << h;
      EXPECT_NEAR(got[s][h].score, want[s][h].score, kScoreTolerance)
          << what << ", sentence " << s << " hyp " << h;
    }
  }
}

std::set<int64_t> tokens_of(const Hyps& hyps) {
  std::set<int64_t> out;
  for (const auto& sentence : hyps)
    for (const kiln::Hypothesis& h : sentence) out.insert(h.ids.begin(), h.ids.end());
  return out;
}

// The search settings every comparison runs: greedy, beam search (with min_decoding_length
// and a stop id) and sampling.
struct Setting {
  const char* name;
  std::function<void(kiln::SearchOptions&)> set;
};
const std::vector<Setting> kSettings = {
    {"greedy", [](kiln::SearchOptions&) {}},
    {"beam 4 x 2", [](kiln::SearchOptions& o) { o = options(4, 2); }},
    {"beam 3, min length 4",
     [](kiln::SearchOptions& o) {
       o = options(3, 1);
       o.min_decoding_length = 4;
     }},
    {"beam 2, length penalty",
     [](kiln::SearchOptions& o) {
       o = options(2, 2);
       o.length_penalty = 0.6f;
     }},
    {"sampling",
     [](kiln::SearchOptions& o) {
       o.sampling_top_k = 0;
       o.seed = 7;
     }},
    {"sampling top-k 5, top-p 0.9", [](kiln::SearchOptions& o) {
       o.sampling_top_k = 5;
       o.sampling_top_p = 0.9f;
       o.seed = 11;
     }}};

kiln::SearchOptions setting_options(const Setting& s) {
  kiln::SearchOptions o = options(1, 1);
  s.set(o);
  return o;
}

TEST(VocabularyRestriction, EveryIdGivesTheUnrestrictedSearch) {
  kiln_models::golden_tiny model(golden("tiny.weights.safetensors").c_str());
  // Every id, shuffled, with duplicates: the order and repeats of the caller's ids do not
  // matter.
  std::vector<int64_t> every(kVocab);
  std::iota(every.begin(), every.end(), 0);
  every.insert(every.end(), {7, 0, 40, 2, 7});
  std::shuffle(every.begin(), every.end(), std::mt19937(3));
  for (const Setting& s : kSettings) {
    kiln::SearchOptions o = setting_options(s);
    const Hyps want = model.generate(sources(), o);
    restrict_to(o, every);
    expect_same(model.generate(sources(), o), want, s.name);
  }
}

TEST(VocabularyRestriction, SubsetGivesTheSearchOverMaskedLogits) {
  kiln_models::golden_tiny model(golden("tiny.weights.safetensors").c_str());
  // The subset: every id but the two the unrestricted beam search generates most, so that the
  // restricted search must differ from it; end_id (2) left out too (it is always allowed).
  const Hyps unrestricted = model.generate(sources(), options(4, 2));
  std::vector<int64_t> count(kVocab);
  for (const auto& sentence : unrestricted)
    for (const kiln::Hypothesis& h : sentence)
      for (int64_t id : h.ids) ++count[static_cast<size_t>(id)];
  std::vector<int64_t> by_count(kVocab);
  std::iota(by_count.begin(), by_count.end(), 0);
  std::stable_sort(by_count.begin(), by_count.end(), [&](int64_t a, int64_t b) {
    return count[static_cast<size_t>(a)] > count[static_cast<size_t>(b)];
  });
  ASSERT_GT(count[static_cast<size_t>(by_count[0])], 0);
  std::vector<int64_t> subset;
  std::set<int64_t> allowed = {2};  // with the end token
  for (int64_t id = 0; id < kVocab; ++id)
    if (id != by_count[0] && id != by_count[1] && id != 2) {
      subset.push_back(id);
      allowed.insert(id);
    }
  std::reverse(subset.begin(), subset.end());
  const auto masked = masked_model(allowed);
  for (const Setting& s : kSettings) {
    kiln::SearchOptions o = setting_options(s);
    const Hyps full = model.generate(sources(), o);
    const Hyps want = masked->generate(sources(), o);
    restrict_to(o, subset);
    const Hyps got = model.generate(sources(), o);
    expect_same(got, want, s.name);
    for (int64_t id : tokens_of(got)) EXPECT_TRUE(allowed.count(id)) << s.name << ": " << id;
    EXPECT_NE(tokens_of(got), tokens_of(full)) << s.name << ": the restriction changed nothing";
  }
  // A small subset (fewer tokens than beam + 1 would be degenerate: none here): 6 ids.
  const std::vector<int64_t> few = {30, 5, 17, 9, 22, 5, 11};
  const auto masked_few = masked_model({2, 5, 9, 11, 17, 22, 30});
  for (const Setting& s : kSettings) {
    kiln::SearchOptions o = setting_options(s);
    const Hyps want = masked_few->generate(sources(), o);
    restrict_to(o, few);
    const Hyps got = model.generate(sources(), o);
    expect_same(got, want, std::string(s.name) + " (6 ids)");
    for (int64_t id : tokens_of(got))
      EXPECT_TRUE(std::set<int64_t>({5, 9, 11, 17, 22, 30}).count(id)) << s.name << ": " << id;
  }
}

TEST(VocabularyRestriction, StopIdsMinLengthAndStreamingSeeTokenIds) {
  kiln_models::golden_tiny model(golden("tiny.weights.safetensors").c_str());
  const std::vector<int64_t> subset = {4, 8, 15, 16, 23, 35};
  // A stop id outside the subset is allowed (a hypothesis can end with it).
  const int64_t stop[] = {16, 37};
  const auto masked = masked_model({2, 4, 8, 15, 16, 23, 35, 37});
  for (int32_t beam : {1, 3}) {
    kiln::SearchOptions o = options(beam, 1);
    o.stop_ids = stop;
    o.num_stop_ids = 2;
    o.min_decoding_length = 3;
    const Hyps want = masked->generate(sources(), o);
    restrict_to(o, subset);
    const Hyps got = model.generate(sources(), o);
    expect_same(got, want, fmt::format("beam {} with stop ids", beam));
    for (const auto& sentence : got) EXPECT_GE(sentence[0].ids.size(), 3u);
  }
  // Greedy streaming: the streamed tokens are the returned ids.
  std::vector<std::vector<int64_t>> streamed(3);
  kiln::SearchOptions o = options(1, 1);
  restrict_to(o, subset);
  o.user_data = &streamed;
  o.on_token = [](void* user, int64_t sentence, int64_t, int64_t token) {
    (*static_cast<std::vector<std::vector<int64_t>>*>(user))[sentence].push_back(token);
  };
  const Hyps greedy = model.generate(sources(), o);
  for (size_t s = 0; s < greedy.size(); ++s) {
    EXPECT_EQ(streamed[s], greedy[s][0].ids) << s;
    for (int64_t id : streamed[s]) EXPECT_TRUE(std::count(subset.begin(), subset.end(), id)) << id;
  }
}

// The generator copies the ids at creation and restricts every sentence as kiln_generate.
TEST(VocabularyRestriction, GeneratorRestrictsEverySentence) {
  kiln_models::golden_tiny model(golden("tiny.weights.safetensors").c_str());
  kiln::SearchOptions o = options(2, 1);
  std::vector<int64_t> subset = {3, 6, 9, 12, 18, 21, 24, 27, 33, 39};
  restrict_to(o, subset);
  const Hyps want = model.generate(sources(), o);
  kiln_generator* g = kiln_generator_create(model.get(), &o);
  ASSERT_NE(g, nullptr) << kiln_model_error(model.get());
  std::fill(subset.begin(), subset.end(), 0);  // the caller's array need not outlive create
  kiln::Tensor<int64_t> src = sources();
  Hyps got(3);
  for (int64_t b = 0; b < 3; ++b) {  // one sentence at a time (an encoder–decoder's joins)
    kiln_tensor in{};
    in.name = "src";
    in.dtype = KILN_I64;
    in.rank = 2;
    in.shape[0] = 1;
    in.shape[1] = 6;
    in.data = src.data.data() + b * 6;
    in.capacity = 6 * sizeof(int64_t);
    int64_t id = -1;
    ASSERT_EQ(kiln_generator_add(g, &in, 0, &id), 0) << kiln_model_error(model.get());
    while (kiln_generator_step(g) > 0) {
    }
    kiln_generation r;
    ASSERT_EQ(kiln_generator_take(g, id, &r), 0) << kiln_model_error(model.get());
    got[b].push_back({std::vector<int64_t>(r.ids, r.ids + r.lengths[0]), r.scores[0]});
    kiln_generation_free(&r);
  }
  kiln_generator_free(g);
  for (size_t s = 0; s < want.size(); ++s) {
    EXPECT_EQ(got[s][0].ids, want[s][0].ids) << s;
    EXPECT_NEAR(got[s][0].score, want[s][0].score, kScoreTolerance) << s;
  }
}

TEST(VocabularyRestriction, BadRestrictionsAreRefused) {
  kiln_models::golden_tiny model(golden("tiny.weights.safetensors").c_str());
  const std::vector<int64_t> out_of_range = {3, 41}, negative = {-1};
  kiln::SearchOptions o = options(1, 1);
  restrict_to(o, out_of_range);
  EXPECT_EQ(error_of([&] { model.generate(sources(), o); }),
            "vocabulary[1] is 41; it must be a target token id in [0, 41)");
  restrict_to(o, negative);
  EXPECT_EQ(error_of([&] { model.generate(sources(), o); }),
            "vocabulary[0] is -1; it must be a target token id in [0, 41)");
  o.num_vocabulary = -2;
  EXPECT_EQ(error_of([&] { model.generate(sources(), o); }),
            "num_vocabulary is -2; it must be at least 0 (0: no vocabulary restriction)");
  o.vocabulary = nullptr;
  o.num_vocabulary = 3;
  EXPECT_EQ(error_of([&] { model.generate(sources(), o); }),
            "vocabulary is NULL with num_vocabulary 3");
  // kiln_generator_create refuses them too (NULL, the message in kiln_model_error).
  EXPECT_EQ(kiln_generator_create(model.get(), &o), nullptr);
  EXPECT_STREQ(kiln_model_error(model.get()), "vocabulary is NULL with num_vocabulary 3");
  // NULL/0 is no restriction, and the model stays usable.
  kiln::SearchOptions none = options(1, 1);
  const Hyps before = model.generate(sources(), none);
  none.vocabulary = out_of_range.data();  // with 0 ids: not read
  expect_same(model.generate(sources(), none), before, "0 ids");
}

// A library compiled from IR without decode_step_restricted (unrestricted_tiny: the tiny
// model's IR with that function removed, as a kiln before it wrote it): generation works, a
// restriction is refused saying to recompile.
TEST(VocabularyRestriction, LibraryWithoutTheRestrictedStepIsRefused) {
  kiln_models::unrestricted_tiny old(golden("tiny.weights.safetensors").c_str());
  kiln_models::golden_tiny model(golden("tiny.weights.safetensors").c_str());
  ASSERT_LT(kiln_model_num_inputs(old.get(), "decode_step_restricted"), 0);
  kiln::SearchOptions o = options(2, 1);
  expect_same(old.generate(sources(), o), model.generate(sources(), o), "unrestricted");
  const std::vector<int64_t> subset = {3, 4, 5};
  restrict_to(o, subset);
  const std::string why =
      "vocabulary restriction needs the model's entry point 'decode_step_restricted', which "
      "this library lacks (compiled by a kiln before it, or from IR without it): recompile "
      "the model with this kiln";
  EXPECT_EQ(error_of([&] { old.generate(sources(), o); }), why);
  EXPECT_EQ(kiln_generator_create(old.get(), &o), nullptr);
  EXPECT_EQ(kiln_model_error(old.get()), why);
}

}  // namespace
}  // namespace kiln
