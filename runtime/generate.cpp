// Generation over a compiled model (see kiln/runtime.h, kiln_generate and kiln_generator_*):
// greedy search, beam search and sampling, as specified in tests/golden/make_decode_golden.py
// (the PyTorch reference the tests compare with), for both protocols: an encoder–decoder's
// `prepare` and `decode_step` (frontend/nn.h), and a decoder-only model's `prefill` and
// `decode_step` (frontend/causal_lm.h). One search serves both; they differ only in how the
// first logits come and what each step is given.
//
// State. Each layer's self-attention cache is one buffer [T, C, D], allocated by the first
// batch and written in place; its first axis is time. A decoding step feeds one token per
// live hypothesis, all at the same time τ (decode_step's `pos`): the hypothesis in row n
// writes its keys at [τ, n]. A hypothesis's earlier keys stay where they were written; its
// row of the `rows` table lists, for each time j, the slot holding its keys of time j
// (FasterTransformer's beam indirection), -1 where it has none, so reordering beams copies a
// few integers per time, never the cache. Finished sentences leave the batch: later steps run
// on the remaining hypotheses only.
//
// Encoder–decoder: `prepare` projects the encoder output into every decoder layer's
// cross-attention keys and values once per batch; all hypotheses of a sentence read them
// through their source row (never copied per beam); a step feeds the start token or the last
// token. Decoder-only: `prefill` runs the prompts (left-padded to the longest, prompt b
// starting at time start[b]) as GEMMs and gives the logits of token 0; later steps feed the
// last token, at position τ - start[b] of its sentence.
//
// Joining (kiln_generator_*, continuous batching). A decoder-only model's positions are per
// row (τ - start), so sentences may join a running batch at a step boundary: the newcomers'
// prompts are prefilled on their own, their keys copied into free slots of the times just
// before τ (prompt b of length L_b at times τ - L_b .. τ - 1, start[b] = τ - L_b), and from
// the next step on they are rows like any other. They fit while their prompts are no longer
// than τ, their tokens within the cache's times (the model's max_len), and the rows within
// max_batch sentences and max_batch × max_beam hypotheses. An encoder–decoder's decode_step
// has one position for every row, so its sentences join only a batch with none running.
//
// Vocabulary restriction (kiln_search_options.vocabulary, an encoder–decoder's): each step
// runs `decode_step_restricted` with the allowed ids (sorted, unique, the end and stop ids
// among them), whose logits hold only those columns. The search works on columns: column c
// is token vocab_ids_[c], and since the ids are sorted, the lower column is the lower id, so
// ties break as in the full search. The result is the full search's with every other token's
// logit -inf (the log-softmax is over the set), except that where fewer tokens than
// beam_size + ends are allowed, no hypothesis of probability 0 is grown.
#include "runtime/generate.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "runtime/model.h"
#include "runtime/search_kernels.h"
#include "runtime/thread_pool.h"
#include "support/error.h"

namespace kiln::rt {
namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();
constexpr float kInfinity = std::numeric_limits<float>::infinity();

struct Hyp {
  int64_t sentence = 0;
  std::vector<int64_t> tokens;  // generated so far (no start token)
  std::vector<int64_t> slots;   // slots[k]: the slot holding its keys of time first + k
  double cum = 0;               // sum of the generated tokens' log-probabilities
};

struct Finished {
  std::vector<int64_t> tokens;
  double score = 0;  // normalized
};

// One sentence (source or prompt) of the batch.
struct Sentence {
  int64_t start = 0;  // decoder-only: the time of its prompt's first token (its `start`)
  int64_t first = 0;  // the time its first decoding step writes
  std::vector<int64_t> prompt_slots;  // decoder-only: times [start, first): the slot of each
  int64_t src_row = 0;                // encoder–decoder: its row of the memory
  int32_t max_decoding_length = 0;
  std::vector<Finished> finished;
  bool done = false;
};

struct Buffer {
  std::vector<int64_t> shape;
  AlignedBytes bytes;  // numel() floats, or more
  float* data() const { return reinterpret_cast<float*>(bytes.data.get()); }
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
};

kiln_tensor view(const char* name, int32_t dtype, const std::vector<int64_t>& shape, void* data,
                 size_t bytes) {
  kiln_tensor t{};
  t.name = name;
  t.dtype = dtype;
  t.rank = static_cast<int32_t>(shape.size());
  for (size_t d = 0; d < shape.size(); ++d) t.shape[d] = shape[d];
  t.data = data;
  t.capacity = bytes;
  return t;
}

int64_t config_int(const kiln_model* m, const char* key, int64_t fallback) {
  const char* v = kiln_model_config(m, key);
  if (!v) return fallback;
  int64_t out = 0;
  auto [end, ec] = std::from_chars(v, v + std::strlen(v), out);
  if (ec != std::errc() || *end) fail("model config '{}' is '{}', not an integer", key, v);
  return out;
}

double normalized(double cum, int64_t length, double penalty) {
  return penalty == 0 ? cum : cum / std::pow(static_cast<double>(length), penalty);
}

}  // namespace

// The search and its state (see the top of this file). Not thread-safe: one caller at a time.
class Search {
 public:
  Search(kiln_model* model, const kiln_search_options& o, bool joinable)
      : m_(model), o_(o), joinable_(joinable), rng_(o.seed) {
    if (!joinable && model) kept_ = &model->generation_buffers;
    check_model();
    check_options();
    // ends_ and vocab_ids_ hold them: the caller's arrays need not outlive this call.
    o_.stop_ids = nullptr;
    o_.num_stop_ids = 0;
    o_.vocabulary = nullptr;
    o_.num_vocabulary = 0;
  }

  // A one-call search gives its buffers back to the model (BufferCache) for the next call.
  ~Search() {
    if (!kept_) return;
    for (std::vector<Buffer>* v : {&mem_, &cache_})
      for (Buffer& b : *v) kept_->give(std::move(b.bytes));
    kept_->give(std::move(logits_));
  }
  Search(const Search&) = delete;
  Search& operator=(const Search&) = delete;

  // Adds the sentences `src`, at ids size() .., decoding at most `max_decoding_length` tokens
  // (0: the options'); false (nothing changed) when they cannot join the running batch now.
  // Throws for bad input.
  bool add(const kiln_tensor& src, int32_t max_decoding_length = 0) {
    if (max_decoding_length < 0)
      fail("max_decoding_length is {}; it must be at least 1 (or 0: the generator's)",
           max_decoding_length);
    check_inputs(src, max_decoding_length > 0 ? max_decoding_length : o_.max_decoding_length);
    if (alive_sentences_ == 0) reset();
    const int64_t n = src.shape[0];
    if (running() && !can_join(n)) return false;
    if (causal_)
      prefill(n);  // a sentence may end with its first token (select_all reports it)
    else
      prepare(src, n);
    return true;
  }

  // One step: every live hypothesis one token further.
  void step() {
    if (alive_.empty()) return;
    decode();
    std::vector<Hyp> next;
    select_all(alive_, next);
    alive_ = std::move(next);
    ++time_;
  }

  int64_t size() const { return static_cast<int64_t>(sentences_.size()); }
  bool done(int64_t id) const { return sentences_[static_cast<size_t>(id)].done; }
  int64_t alive() const { return alive_sentences_; }
  bool running() const { return !alive_.empty(); }
  // The ids of the sentences finished since the last call.
  std::vector<int64_t> take_finished() { return std::exchange(finished_ids_, {}); }

  // The results of sentences [begin, end), as kiln_generate returns them.
  Generation collect(int64_t begin, int64_t end) const {
    Generation g;
    g.batch = end - begin;
    g.hypotheses = o_.num_hypotheses;
    g.max_length = 0;
    for (int64_t b = begin; b < end; ++b)
      g.max_length = std::max<int64_t>(g.max_length, sentences_[b].max_decoding_length);
    const size_t per = static_cast<size_t>(g.hypotheses);
    g.ids.assign(static_cast<size_t>(g.batch) * per * static_cast<size_t>(g.max_length), -1);
    g.lengths.assign(static_cast<size_t>(g.batch) * per, 0);
    g.scores.assign(static_cast<size_t>(g.batch) * per, -std::numeric_limits<float>::infinity());
    for (int64_t b = 0; b < g.batch; ++b) {
      std::vector<Finished> fin = sentences_[static_cast<size_t>(begin + b)].finished;
      std::stable_sort(fin.begin(), fin.end(),
                       [](const Finished& x, const Finished& y) { return x.score > y.score; });
      for (size_t h = 0; h < per && h < fin.size(); ++h) {
        const size_t at = static_cast<size_t>(b) * per + h;
        g.lengths[at] = static_cast<int64_t>(fin[h].tokens.size());
        g.scores[at] = static_cast<float>(fin[h].score);
        std::copy(fin[h].tokens.begin(), fin[h].tokens.end(),
                  g.ids.begin() + static_cast<int64_t>(at) * g.max_length);
      }
    }
    return g;
  }

  // Ends sentence `id` now (a request its client gave up): its hypotheses leave the batch, and
  // it is finished with the hypotheses finished so far (none, or fewer than asked).
  void cancel(int64_t id) {
    Sentence& s = sentences_.at(static_cast<size_t>(id));
    if (s.done) return;
    std::erase_if(alive_, [&](const Hyp& h) { return h.sentence == id; });
    s.done = true;
    --alive_sentences_;
    finished_ids_.push_back(id);
  }

  // Frees what sentence `id` holds once its result is taken.
  void forget(int64_t id) {
    Sentence& s = sentences_.at(static_cast<size_t>(id));
    s.finished.clear();
    s.finished.shrink_to_fit();
    s.prompt_slots.clear();
    s.prompt_slots.shrink_to_fit();
  }

 private:
  void check_model() {
    auto has = [&](const char* f) { return kiln_model_num_inputs(m_, f) >= 0; };
    const char* kind = kiln_model_config(m_, "generation");
    causal_ = kind && std::string(kind) == "causal_lm";
    if (causal_) {
      if (!has("prefill") || !has("decode_step"))
        fail(
            "model is a decoder-only model (generation = causal_lm) without {}: it cannot "
            "generate",
            !has("prefill") && !has("decode_step") ? "'prefill' and 'decode_step'"
            : !has("prefill")                      ? "'prefill'"
                                                   : "'decode_step'");
    } else if (!has("prepare") || !has("decode_step")) {
      if (has("prepare") || has("decode_step") || has("prefill"))
        fail("model has {} but no {}: it cannot generate",
             has("decode_step") ? "'decode_step'"
             : has("prefill")   ? "'prefill'"
                                : "'prepare'",
             has("decode_step") ? "'prepare' (an encoder–decoder) or 'prefill' (a decoder-only "
                                  "model, nn::add_causal_lm)"
                                : "'decode_step'");
      fail(
          "model has no generation entry points: it cannot generate (an encoder–decoder needs "
          "'prepare' and 'decode_step' (nn::add_seq2seq derives them), a decoder-only model "
          "'prefill' and 'decode_step' (nn::add_causal_lm))");
    }
    const int n_in = kiln_model_num_inputs(m_, "decode_step");
    for (int i = 0; i < n_in; ++i) {
      const std::string name = kiln_model_input_name(m_, "decode_step", i);
      if (name.rfind("cache_k", 0) == 0) ++layers_;
    }
    max_len_ = kiln_model_symbol_max(m_, "T");
    max_rows_ = kiln_model_symbol_max(m_, "N");
    max_batch_ = kiln_model_symbol_max(m_, causal_ ? "N" : "B");
    if (max_len_ < 1 || max_rows_ < 1 || max_batch_ < 1)
      fail("model's decode_step lacks the symbols T, N and B");
    max_beam_ = config_int(m_, "max_beam", max_rows_ / max_batch_);
    if (causal_) max_batch_ = config_int(m_, "max_batch", max_batch_);
    vocab_ = config_int(m_, causal_ ? "vocab" : "tgt_vocab", -1);
  }

  // The options, checked once (kiln_generate and kiln_generator_create).
  void check_options() {
    const kiln_search_options& o = o_;
    if (o.beam_size < 1) fail("beam_size is {}; it must be at least 1", o.beam_size);
    if (o.beam_size > max_beam_)
      fail("beam_size {} is above the compiled maximum {} (max_beam)", o.beam_size, max_beam_);
    if (o.num_hypotheses < 1 || o.num_hypotheses > o.beam_size)
      fail("num_hypotheses is {}; it must be between 1 and beam_size {}", o.num_hypotheses,
           o.beam_size);
    if (o.max_decoding_length < 0)
      fail("max_decoding_length is {}; it must be at least 1 (or 0: {})", o.max_decoding_length,
           causal_ ? "as many as fit" : "the model's max_len");
    if (o.min_decoding_length < 0)
      fail("min_decoding_length is {}; it must be between 0 and max_decoding_length {}",
           o.min_decoding_length, o.max_decoding_length);
    if (!std::isfinite(o.length_penalty))
      fail("length_penalty is {}; it must be finite", o.length_penalty);
    if (o.sampling_top_k < 0) fail("sampling_top_k is {}; it must be >= 0", o.sampling_top_k);
    if (!(o.sampling_temperature > 0) || !std::isfinite(o.sampling_temperature))
      fail("sampling_temperature is {}; it must be positive and finite", o.sampling_temperature);
    if (!(o.sampling_top_p > 0 && o.sampling_top_p <= 1))
      fail("sampling_top_p is {}; it must be in (0, 1]", o.sampling_top_p);
    if (o.num_stop_ids < 0 || (o.num_stop_ids > 0 && !o.stop_ids))
      fail("stop_ids: {} ids at {}", o.num_stop_ids, o.stop_ids ? "an address" : "NULL");
    sampling_ = o.sampling_top_k != 1;  // 1: the best token (greedy or beam search)
    if (sampling_ && o.beam_size != 1)
      fail("sampling (sampling_top_k {}) needs beam_size 1, got {}", o.sampling_top_k, o.beam_size);
    // -1, and only -1, means the model's bos_id or eos_id.
    for (auto [what, id, key] :
         {std::tuple{"start_id", o.start_id, "bos_id"}, std::tuple{"end_id", o.end_id, "eos_id"}})
      if (id < -1) fail("{} is {}; it must be a token id, or -1 for the model's {}", what, id, key);
    start_ = o.start_id >= 0 ? o.start_id : config_int(m_, "bos_id", -1);
    end_ = o.end_id >= 0 ? o.end_id : config_int(m_, "eos_id", -1);
    // A decoder-only model continues its prompts: it needs no start token, and without an
    // end token it generates max_decoding_length tokens.
    if (start_ < 0 && !causal_)
      fail("no start token: set start_id (the model config has no bos_id)");
    if (end_ < 0 && !causal_) fail("no end token: set end_id (the model config has no eos_id)");
    if (vocab_ > 0)
      for (auto [what, id] : {std::pair{"start_id", start_}, {"end_id", end_}})
        if (id >= vocab_) fail("{} {} is out of range [0, {})", what, id, vocab_);
    if (end_ >= 0) ends_.push_back(end_);
    for (int32_t i = 0; i < o.num_stop_ids; ++i) {
      const int64_t id = o.stop_ids[i];
      if (id < 0 || (vocab_ > 0 && id >= vocab_))
        fail("stop_ids[{}] is {}; it must be a token id in [0, {})", i, id, vocab_);
      if (std::find(ends_.begin(), ends_.end(), id) == ends_.end()) ends_.push_back(id);
    }
    check_vocabulary();
  }

  // The vocabulary restriction (kiln_search_options.vocabulary) into vocab_ids_: the ids
  // sorted and unique, with the end ids (ends_) added; end_column_ is end_'s column.
  void check_vocabulary() {
    const kiln_search_options& o = o_;
    if (o.num_vocabulary < 0)
      fail("num_vocabulary is {}; it must be at least 0 (0: no vocabulary restriction)",
           o.num_vocabulary);
    if (o.num_vocabulary > 0 && !o.vocabulary)
      fail("vocabulary is NULL with num_vocabulary {}", o.num_vocabulary);
    if (o.num_vocabulary == 0) return;
    if (causal_)
      fail(
          "vocabulary restriction is for encoder–decoder models (their decode_step_restricted); "
          "this is a decoder-only model (generation = causal_lm)");
    if (kiln_model_num_inputs(m_, "decode_step_restricted") < 0)
      fail(
          "vocabulary restriction needs the model's entry point 'decode_step_restricted', which "
          "this library lacks (compiled by a kiln before it, or from IR without it): recompile "
          "the model with this kiln");
    // The target vocabulary's size: the config's tgt_vocab, else the bound of the restricted
    // step's symbol R (1..tgt_vocab).
    const int64_t size = vocab_ > 0 ? vocab_ : kiln_model_symbol_max(m_, "R");
    vocab_ids_.assign(o.vocabulary, o.vocabulary + o.num_vocabulary);
    for (int32_t i = 0; i < o.num_vocabulary; ++i)
      if (vocab_ids_[i] < 0 || (size > 0 && vocab_ids_[i] >= size))
        fail("vocabulary[{}] is {}; it must be a target token id in [0, {})", i, vocab_ids_[i],
             size);
    vocab_ids_.insert(vocab_ids_.end(), ends_.begin(), ends_.end());
    std::sort(vocab_ids_.begin(), vocab_ids_.end());
    vocab_ids_.erase(std::unique(vocab_ids_.begin(), vocab_ids_.end()), vocab_ids_.end());
    restricted_ = true;
    end_column_ = column_of(end_);
  }

  // The token of column c of logits_ (see the top of this file).
  int64_t token_of(int64_t c) const { return restricted_ ? vocab_ids_[static_cast<size_t>(c)] : c; }
  // The column of logits_ holding `token` (an id of vocab_ids_ where restricted); -1 for -1.
  int64_t column_of(int64_t token) const {
    if (!restricted_ || token < 0) return token;
    const auto at = std::lower_bound(vocab_ids_.begin(), vocab_ids_.end(), token);
    KILN_ASSERT(at != vocab_ids_.end() && *at == token, "the end ids are in the vocabulary");
    return at - vocab_ids_.begin();
  }

  // The sentences of one add(): their shape, prompts (decoder-only) and decoding length.
  void check_inputs(const kiln_tensor& src, int32_t max_decoding_length) {
    const char* what = causal_ ? "prompts" : "source ids";
    if (src.rank != 2) fail("{} must be a [batch, length] tensor, got rank {}", what, src.rank);
    if (src.shape[0] < 1)
      fail("empty batch: no {} to continue", causal_ ? "prompt" : "source sentence");
    if (src.shape[1] < 1)
      fail("{} have length {}", causal_ ? "prompts" : "source sentences", src.shape[1]);
    prompt_len_ = 0;
    if (causal_) read_prompts(src);
    // Room for new tokens: max_len, less the longest prompt.
    const int64_t room = max_len_ - prompt_len_;
    if (causal_ && room < 1)
      fail(
          "the longest prompt has {} tokens, which leaves no room to generate within the "
          "model's max_len {}",
          prompt_len_, max_len_);
    // 0 (the default): as many as fit
    max_decoding_length_ =
        max_decoding_length > 0
            ? max_decoding_length
            : static_cast<int32_t>(std::min<int64_t>(room, std::numeric_limits<int32_t>::max()));
    if (max_decoding_length_ > room) {
      if (causal_)
        fail(
            "max_decoding_length {} and the longest prompt's {} tokens exceed the model's "
            "max_len {}",
            max_decoding_length_, prompt_len_, max_len_);
      fail("max_decoding_length {} is above the model's max_len {}", max_decoding_length_,
           max_len_);
    }
    if (o_.min_decoding_length > max_decoding_length_)
      fail("min_decoding_length is {}; it must be between 0 and max_decoding_length {}",
           o_.min_decoding_length, max_decoding_length_);
    if (src.shape[0] > max_batch_)
      fail("{} {} in one call; the model's maximum is {} (max_batch)", src.shape[0],
           causal_ ? "prompts" : "sentences", max_batch_);
  }

  bool is_end(int64_t token) const {
    return std::find(ends_.begin(), ends_.end(), token) != ends_.end();
  }

  // Prompts [batch, length], each padded with -1 at its end: their lengths and the longest.
  void read_prompts(const kiln_tensor& src) {
    if (src.dtype != KILN_I64 && src.dtype != KILN_I32)
      fail("prompts must be i64 or i32 token ids, got dtype {}", src.dtype);
    const int64_t batch = src.shape[0], width = src.shape[1];
    if (batch > 0 && width > std::numeric_limits<int64_t>::max() / batch)
      fail("prompts [{}, {}] are too large", batch, width);
    const size_t need = static_cast<size_t>(batch * width) * (src.dtype == KILN_I64 ? 8 : 4);
    if (!src.data || src.capacity < need)
      fail("prompts [{}, {}] need {} bytes, the tensor holds {}", batch, width, need,
           src.data ? src.capacity : 0);
    prompts_.assign(static_cast<size_t>(batch), {});
    for (int64_t b = 0; b < batch; ++b) {
      bool ended = false;
      for (int64_t j = 0; j < width; ++j) {
        const int64_t at = b * width + j;
        const int64_t id = src.dtype == KILN_I64 ? static_cast<const int64_t*>(src.data)[at]
                                                 : static_cast<const int32_t*>(src.data)[at];
        if (id == -1) {
          ended = true;
          continue;
        }
        if (ended)
          fail(
              "prompt {} has token {} at position {} after its -1 padding (pad prompts at the "
              "end)",
              b, id, j);
        if (id < 0 || (vocab_ > 0 && id >= vocab_))
          fail("prompt {} has token id {} at position {}, out of range [0, {})", b, id, j, vocab_);
        prompts_[b].push_back(id);
      }
      if (prompts_[b].empty()) fail("prompt {} is empty (every prompt needs a token)", b);
      prompt_len_ = std::max<int64_t>(prompt_len_, static_cast<int64_t>(prompts_[b].size()));
    }
  }

  bool read_cache_widths() {
    const char* widths = kiln_model_config(m_, "cache_widths");
    if (!widths) return false;
    for (const char* p = widths; *p;) {
      int64_t w = 0;
      auto [end, ec] = std::from_chars(p, p + std::strlen(p), w);
      if (ec != std::errc() || w < 1) fail("model config 'cache_widths' is '{}'", widths);
      cache_widths_.push_back(w);
      p = *end == ',' ? end + 1 : end;
    }
    if (static_cast<int64_t>(cache_widths_.size()) != 2 * layers_)
      fail("model config 'cache_widths' lists {} caches, decode_step takes {}",
           cache_widths_.size(), 2 * layers_);
    return true;
  }

  // Nothing alive: the next sentences start a new batch at time 0 (the caches are kept).
  void reset() {
    alive_.clear();
    time_ = 0;
  }

  // Whether n sentences (checked by check_inputs) fit into the running batch now.
  bool can_join(int64_t n) const {
    if (!causal_) return false;  // one position for every row (see the top of this file)
    return alive_sentences_ + n <= max_batch_ &&
           static_cast<int64_t>(alive_.size()) + n * o_.beam_size <= slots_ &&
           prompt_len_ <= time_ && time_ + max_decoding_length_ - 1 <= cache_[0].shape[0];
  }

  // Every layer's caches [times, slots, width]: for one batch (kiln_generate) its longest
  // prompt and decoding length by batch × beam; for sentences that join (kiln_generator_*)
  // the model's max_len by its max_batch × max_beam.
  void allocate_caches(int64_t batch) {
    if (!cache_.empty()) return;
    const int64_t times = joinable_ ? max_len_ : prompt_len_ + max_decoding_length_;
    slots_ = joinable_ ? max_rows_ : batch * o_.beam_size;
    for (int64_t l = 0; l < layers_; ++l) {  // decode_step's cache inputs, named once
      cache_names_.push_back(fmt::format("cache_k{}", l));
      cache_names_.push_back(fmt::format("cache_v{}", l));
    }
    cache_ = make_caches(times, slots_);
  }
  std::vector<Buffer> make_caches(int64_t times, int64_t slots) const {
    std::vector<Buffer> caches(static_cast<size_t>(2 * layers_));
    for (size_t i = 0; i < caches.size(); ++i) {
      Buffer& c = caches[i];
      c.shape = {times, slots, cache_widths_.at(i)};
      c.bytes = floats(c.numel());  // only written slots are read
    }
    return caches;
  }

  // A buffer of n floats (contents undefined): from the model's kept ones in a one-call search.
  AlignedBytes floats(int64_t n) const {
    if (kept_) return kept_->take(n * 4);
    AlignedBytes b;
    b.allocate(n * 4);
    return b;
  }
  void kept_give(AlignedBytes b) const {
    if (kept_) kept_->give(std::move(b));
  }
  const float* logits() const { return reinterpret_cast<const float*>(logits_.data.get()); }

  Sentence& new_sentence() {
    sentences_.emplace_back();
    ++alive_sentences_;
    Sentence& s = sentences_.back();
    s.max_decoding_length = max_decoding_length_;
    return s;
  }

  // The decoder-only prompt pass over the n prompts of prompts_, left-padded to the longest
  // (L): into the caches directly for a new batch (prompt b at times L - L_b .. L - 1 of slot
  // b), else into caches of their own, copied into free slots of the times before time_. Then
  // each prompt's token 0 is chosen from the logits.
  void prefill(int64_t n) {
    if (cache_.empty() && !read_cache_widths())
      fail("decoder-only model has no 'cache_widths' in its config");
    allocate_caches(n);
    const bool join = running();
    const int64_t L = prompt_len_, first_id = size();
    std::vector<int64_t> ids(static_cast<size_t>(n * L), 0), start(static_cast<size_t>(n));
    for (int64_t b = 0; b < n; ++b) {
      const std::vector<int64_t>& p = prompts_[b];
      start[b] = L - static_cast<int64_t>(p.size());
      std::copy(p.begin(), p.end(), ids.begin() + b * L + start[b]);
    }
    std::vector<Buffer> own;
    if (join) own = make_caches(L, n);
    std::vector<Buffer>& caches = join ? own : cache_;
    std::vector<kiln_tensor> in;
    in.push_back(view("ids", KILN_I64, {n, L}, ids.data(), ids.size() * 8));
    in.push_back(view("start", KILN_I64, {n}, start.data(), start.size() * 8));
    add_caches(in, caches);
    std::vector<Hyp> fresh(static_cast<size_t>(n));
    for (int64_t b = 0; b < n; ++b) fresh[b].sentence = first_id + b;
    step_rows_ = &fresh;
    run_for_logits("prefill", in, n, caches);
    step_rows_ = nullptr;
    if (!join) time_ = L;
    for (int64_t b = 0; b < n; ++b) {
      Sentence& s = new_sentence();
      const int64_t len = static_cast<int64_t>(prompts_[b].size());
      s.start = time_ - len;
      s.first = time_;
      if (!join) s.prompt_slots.assign(static_cast<size_t>(len), b);
    }
    if (join) place_prompts(own, n, first_id);
    select_all(fresh, alive_);
  }

  // Copies the joining prompts' keys (`own`, [L, n, width]) into slots of the times before
  // time_ that no live hypothesis reads, recording them as each sentence's prompt_slots.
  void place_prompts(const std::vector<Buffer>& own, int64_t n, int64_t first_id) {
    const int64_t L = prompt_len_;
    std::vector<char> used(static_cast<size_t>(slots_));
    for (int64_t j = time_ - L; j < time_; ++j) {
      std::fill(used.begin(), used.end(), 0);
      for (const Hyp& h : alive_) {
        const Sentence& s = sentences_[h.sentence];
        if (j >= s.start)
          used[j < s.first ? s.prompt_slots[j - s.start] : h.slots[j - s.first]] = 1;
      }
      for (int64_t b = 0; b < n; ++b) {
        Sentence& s = sentences_[first_id + b];
        if (j < s.start) continue;
        const int64_t slot = std::find(used.begin(), used.end(), 0) - used.begin();
        if (slot >= slots_) fail("no free cache slot for a joining prompt (internal error)");
        used[slot] = 1;
        s.prompt_slots.push_back(slot);
        for (size_t c = 0; c < cache_.size(); ++c) {
          const int64_t width = cache_[c].shape[2];
          const float* from = own[c].data() + ((j - (time_ - L)) * n + b) * width;
          std::copy(from, from + width, cache_[c].data() + (j * slots_ + slot) * width);
        }
      }
    }
  }

  void add_caches(std::vector<kiln_tensor>& in, std::vector<Buffer>& caches) {
    for (size_t i = 0; i < caches.size(); ++i)
      in.push_back(view(cache_names_[i].c_str(), KILN_F32, caches[i].shape, caches[i].data(),
                        static_cast<size_t>(caches[i].numel()) * 4));
  }

  // Runs `function` (logits [n, 1, V] and `caches` in place) into logits_, checked.
  void run_for_logits(const char* function, const std::vector<kiln_tensor>& in, int64_t n,
                      std::vector<Buffer>& caches) {
    std::vector<kiln_tensor> out(1 + caches.size());
    if (kiln_model_output_shapes(m_, function, in.data(), in.size(), out.data(), out.size()))
      fail("{}", kiln_model_error(m_));
    if (out[0].rank != 3) fail("model's {} logits have rank {}, expected 3", function, out[0].rank);
    columns_ = out[0].shape[2];
    if (restricted_) {
      if (columns_ != static_cast<int64_t>(vocab_ids_.size()))
        fail("model's {} gives {} logits for {} token ids", function, columns_, vocab_ids_.size());
    } else {
      vocab_ = columns_;
      for (int64_t id : {start_, end_})
        if (id >= vocab_)
          fail("start_id {} or end_id {} is out of range [0, {})", start_, end_, vocab_);
    }
    if (logits_.size < n * columns_ * 4) {  // the most rows a step has (or more)
      kept_give(std::move(logits_));
      logits_ = floats(std::max(n, slots_) * columns_);
    }
    out[0].data = logits_.data.get();
    out[0].capacity = static_cast<size_t>(n * columns_ * 4);
    for (size_t i = 0; i < caches.size(); ++i) {  // updated in place
      out[1 + i].data = caches[i].data();
      out[1 + i].capacity = static_cast<size_t>(caches[i].numel()) * 4;
    }
    if (kiln_model_run(m_, function, in.data(), in.size(), out.data(), out.size()))
      fail("{}", kiln_model_error(m_));
    // Greedy and beam search check the rows as they scan them (scan_rows).
    if (sampling_) check_logits(n);
  }

  // The encoder–decoder's new batch: `prepare` over the sources, one empty hypothesis each.
  void prepare(const kiln_tensor& src, int64_t n) {
    const int n_out = kiln_model_num_outputs(m_, "prepare");
    if (n_out != 2 * layers_)
      fail("model's prepare has {} outputs, expected {}", n_out, 2 * layers_);
    // The sources, kept for decode_step (the caller's need not outlive add()).
    const size_t bytes =
        static_cast<size_t>(src.shape[0] * src.shape[1]) * (src.dtype == KILN_I32 ? 4 : 8);
    if (!src.data || src.capacity < bytes)
      fail("source ids [{}, {}] need {} bytes, the tensor holds {}", src.shape[0], src.shape[1],
           bytes, src.data ? src.capacity : 0);
    src_bytes_.assign(static_cast<const char*>(src.data),
                      static_cast<const char*>(src.data) + bytes);
    src_ = src;
    src_.name = "src";
    src_.data = src_bytes_.data();
    src_.capacity = bytes;
    std::vector<kiln_tensor> out(static_cast<size_t>(n_out));
    if (kiln_model_output_shapes(m_, "prepare", &src_, 1, out.data(), out.size()))
      fail("{}", kiln_model_error(m_));
    mem_.resize(out.size());
    for (size_t i = 0; i < out.size(); ++i) {
      mem_[i].shape.assign(out[i].shape, out[i].shape + out[i].rank);
      kept_give(std::move(mem_[i].bytes));
      mem_[i].bytes = floats(mem_[i].numel());
      out[i].data = mem_[i].data();
      out[i].capacity = static_cast<size_t>(mem_[i].numel()) * 4;
    }
    if (kiln_model_run(m_, "prepare", &src_, 1, out.data(), out.size()))
      fail("{}", kiln_model_error(m_));
    mem_names_.clear();
    for (const kiln_tensor& t : out) mem_names_.push_back(t.name);
    if (cache_.empty() && !read_cache_widths())  // without the key: as wide as the memory
      cache_widths_.assign(static_cast<size_t>(2 * layers_), mem_[0].shape[2]);
    allocate_caches(n);
    const int64_t first_id = size();
    for (int64_t b = 0; b < n; ++b) {
      new_sentence().src_row = b;
      alive_.push_back(Hyp{first_id + b, {}, {}, 0});
    }
  }

  // Runs decode_step for every live hypothesis, feeding its last token (or the start token)
  // at time_; fills logits_ [N, V] with the logits of its next token.
  void decode() {
    const int64_t n = static_cast<int64_t>(alive_.size()), width = time_ + 1;
    std::vector<int64_t> tok(n), rows(static_cast<size_t>(n * width)), src_row(n), start(n);
    for (int64_t i = 0; i < n; ++i) {
      const Hyp& h = alive_[i];
      const Sentence& s = sentences_[h.sentence];
      tok[i] = h.tokens.empty() ? start_ : h.tokens.back();
      int64_t* row = &rows[static_cast<size_t>(i * width)];
      for (int64_t j = 0; j < time_; ++j)
        row[j] = j < s.start   ? -1
                 : j < s.first ? s.prompt_slots[j - s.start]
                               : h.slots[j - s.first];
      row[time_] = i;  // this step writes row i's keys to slot i
      src_row[i] = s.src_row;
      start[i] = s.start;
    }
    int64_t pos = time_;
    std::vector<kiln_tensor> in;
    in.push_back(view("tok", KILN_I64, {n, 1}, tok.data(), tok.size() * 8));
    in.push_back(view("pos", KILN_I64, {1}, &pos, 8));
    in.push_back(view("rows", KILN_I64, {n, width}, rows.data(), rows.size() * 8));
    if (causal_) {
      in.push_back(view("start", KILN_I64, {n}, start.data(), start.size() * 8));
    } else {
      in.push_back(view("src_row", KILN_I64, {n}, src_row.data(), src_row.size() * 8));
      in.push_back(src_);
      for (size_t i = 0; i < mem_.size(); ++i)
        in.push_back(view(mem_names_[i].c_str(), KILN_F32, mem_[i].shape, mem_[i].data(),
                          static_cast<size_t>(mem_[i].numel()) * 4));
    }
    add_caches(in, cache_);
    if (restricted_)  // its last input: the columns' token ids
      in.push_back(view("vocab", KILN_I64, {static_cast<int64_t>(vocab_ids_.size())},
                        vocab_ids_.data(), vocab_ids_.size() * 8));
    step_rows_ = &alive_;
    run_for_logits(restricted_ ? "decode_step_restricted" : "decode_step", in, n, cache_);
    step_rows_ = nullptr;
  }

  // Refuses logits that are NaN or +inf in any of the n rows (the search would pick an
  // arbitrary token, or none, and return a plausible-looking result). -inf is a token that
  // cannot be chosen, as long as some token can.
  // The first pass is branch-free, so it vectorizes (W5's 128 rows of 32000 logits: 0.6
  // ms a step, where a loop that stops at the first bad value took 3.4 ms); only a bad
  // row is searched again for the message. Greedy and beam search take the flags from the
  // first pass of log_sum_exp in scan_rows instead, which reads each row anyway: a step then
  // reads the logits from memory once, not twice.
  // The rows are checked in parallel (for_rows), then reported in order.
  void check_logits(int64_t n) {
    std::vector<uint8_t> flags(static_cast<size_t>(n));
    for_rows(n, [&](int64_t i) {
      const float* row = logits() + i * columns_;
      int bad = 0, finite_or_plus = 0;
      for (int64_t v = 0; v < columns_; ++v) {
        bad |= !(row[v] < kInfinity);  // NaN or +inf
        finite_or_plus |= row[v] > -kInfinity;
      }
      flags[static_cast<size_t>(i)] = logit_flags(bad, finite_or_plus);
    });
    report_bad_logits(*step_rows_, [&](int64_t i) { return flags[static_cast<size_t>(i)]; });
  }

  // Fails naming the first of `rows` whose flags (search_kernels.h) say its logits hold NaN or
  // +inf, or nothing above -inf.
  template <typename Flags>
  void report_bad_logits(const std::vector<Hyp>& rows, Flags&& flags_of) {
    constexpr const char* kWhy = "the model's weights or its input hold NaN or infinity";
    for (int64_t i = 0; i < static_cast<int64_t>(rows.size()); ++i) {
      const int64_t sentence = rows[static_cast<size_t>(i)].sentence;
      const int64_t t = static_cast<int64_t>(rows[static_cast<size_t>(i)].tokens.size());
      const float* row = logits() + i * columns_;
      const uint8_t flags = flags_of(i);
      const bool bad = flags & kLogitNanOrPlusInf, finite_or_plus = flags & kLogitAboveMinusInf;
      if (bad)
        for (int64_t v = 0; v < columns_; ++v)
          if (!(row[v] < kInfinity))
            fail("non-finite logit at step {} of batch row {}: token {} has logit {} ({})", t,
                 sentence, token_of(v), row[v], kWhy);
      if (!finite_or_plus)
        fail("non-finite logits at step {} of batch row {}: every token has logit -inf ({})", t,
             sentence, kWhy);
    }
  }

  // Chooses the next token of every hypothesis of `in` (grouped by sentence) from logits_,
  // appending those that go on to `out`; a sentence with none going on is done.
  void select_all(const std::vector<Hyp>& in, std::vector<Hyp>& out) {
    if (!sampling_) scan_rows(in);
    for (size_t i = 0; i < in.size();) {
      size_t end = i;
      while (end < in.size() && in[end].sentence == in[i].sentence) ++end;
      const size_t before = out.size();
      const int64_t t = static_cast<int64_t>(in[i].tokens.size());
      if (sampling_)
        sample(in, i, t, out);
      else
        select(in, i, end, t, out);
      if (out.size() == before) {
        sentences_[in[i].sentence].done = true;
        --alive_sentences_;
        finished_ids_.push_back(in[i].sentence);
      }
      i = end;
    }
  }
  // Runs row(i) for every i in [0, n) on the runtime's thread pool (thread_pool.h: on the
  // calling thread alone while the pool is busy). An exception of row (out of memory) stops
  // the rows not started and becomes kiln::Error here, on the calling thread.
  template <typename Row>
  static void for_rows(int64_t n, Row&& row) {
    auto task = [](void*, int i, uint8_t* closure) -> int {
      try {
        (*reinterpret_cast<std::remove_reference_t<Row>*>(closure))(static_cast<int64_t>(i));
        return 0;
      } catch (...) {
        return 1;
      }
    };
    if (pool_par_for(nullptr, task, 0, static_cast<int>(n), reinterpret_cast<uint8_t*>(&row)))
      fail("the search's work on the rows of logits failed (out of memory)");
  }

  // Each row's log-sum-exp and best tokens (what select needs of it) into scans_, the rows
  // in parallel: W5's 128 rows of 32000 logits a step on one thread were 4-5% of its beam
  // search (AMD EPYC Zen 4, 2 threads).
  struct RowScan {
    double lse = 0;
    uint8_t flags = 0;  // log_sum_exp's (search_kernels.h): the row's check
    std::vector<int64_t> best;
  };
  void scan_rows(const std::vector<Hyp>& in) {
    scans_.resize(in.size());
    const int64_t V = columns_, n_ends = static_cast<int64_t>(ends_.size());
    for_rows(static_cast<int64_t>(in.size()), [&](int64_t i) {
      const float* row = logits() + i * V;
      const bool no_end_yet =
          static_cast<int64_t>(in[static_cast<size_t>(i)].tokens.size()) < o_.min_decoding_length;
      RowScan& scan = scans_[static_cast<size_t>(i)];
      scan.lse = log_sum_exp(row, V, &scan.flags);
      // The K + (end tokens) best tokens of this beam suffice: K of them continue it. With one
      // end token the search kernel leaves it out itself before min_decoding_length. `best`
      // holds columns (select maps them to tokens).
      best_tokens(row, V, std::min<int64_t>(V, o_.beam_size + n_ends),
                  no_end_yet && n_ends == 1 ? end_column_ : -1, scan.best);
    });
    report_bad_logits(in, [&](int64_t i) { return scans_[static_cast<size_t>(i)].flags; });
  }

  // Beam search (greedy when beam_size is 1) for the hypotheses [begin, end) of one sentence.
  void select(const std::vector<Hyp>& alive, size_t begin, size_t end, int64_t t,
              std::vector<Hyp>& next) {
    const int64_t K = o_.beam_size, V = columns_;
    struct Cand {
      double score;
      int64_t beam, token;
    };
    std::vector<Cand> cands;
    const bool no_end_yet = t < o_.min_decoding_length;
    for (size_t i = begin; i < end; ++i) {
      const float* row = logits() + i * V;
      const double lse = scans_[i].lse;  // scan_rows
      for (int64_t c : scans_[i].best)
        if (const int64_t v = token_of(c); !(no_end_yet && is_end(v)))
          cands.push_back({alive[i].cum + (static_cast<double>(row[c]) - lse),
                           static_cast<int64_t>(i - begin), v});
    }
    std::stable_sort(cands.begin(), cands.end(), [](const Cand& a, const Cand& b) {
      if (a.score != b.score) return a.score > b.score;
      if (a.beam != b.beam) return a.beam < b.beam;
      return a.token < b.token;
    });
    const int64_t sentence = alive[begin].sentence;
    std::vector<Finished>& fin = sentences_[sentence].finished;
    const int32_t max_length = sentences_[sentence].max_decoding_length;
    std::vector<Hyp> grown;
    for (const Cand& c : cands) {
      const Hyp& parent = alive[begin + c.beam];
      if (is_end(c.token)) {
        fin.push_back({parent.tokens, normalized(c.score, t + 1, o_.length_penalty)});
        continue;
      }
      Hyp h;
      h.sentence = sentence;
      h.tokens = parent.tokens;
      h.tokens.push_back(c.token);
      h.slots = parent.slots;
      if (wrote(t))  // where the parent wrote its keys this step
        h.slots.push_back(static_cast<int64_t>(begin) + c.beam);
      h.cum = c.score;
      grown.push_back(std::move(h));
      if (static_cast<int64_t>(grown.size()) == K) break;
    }
    // Greedy: the chosen token streams, unless the end token was chosen (the sentence ends;
    // the runner-up that `grown` holds then is no part of the output).
    if (K == 1 && o_.on_token && !grown.empty() && !is_end(cands.front().token))
      o_.on_token(o_.user_data, sentence, t, grown[0].tokens.back());
    if (t == max_length - 1) {
      for (Hyp& h : grown)
        fin.push_back({h.tokens, normalized(h.cum, max_length, o_.length_penalty)});
      return;
    }
    if (static_cast<int64_t>(fin.size()) >= K) return;  // done
    for (Hyp& h : grown) next.push_back(std::move(h));
  }

  // Whether the logits of token t came from a decoding step, which wrote the keys of the
  // token it fed into the cache (not from a decoder-only model's prefill).
  bool wrote(int64_t t) const { return !causal_ || t > 0; }

  // Sampling (beam_size 1) for hypothesis i: from softmax(logits / temperature) over the
  // sampling_top_k most likely tokens, cut to the top-p nucleus.
  void sample(const std::vector<Hyp>& alive, size_t i, int64_t t, std::vector<Hyp>& next) {
    const int64_t V = columns_;  // ids, lp and pick are columns (token_of maps them)
    const float* row = logits() + i * V;
    const double lse = log_sum_exp(row, V);
    std::vector<double> lp(static_cast<size_t>(V));
    for (int64_t v = 0; v < V; ++v) lp[v] = static_cast<double>(row[v]) - lse;
    if (t < o_.min_decoding_length)
      for (int64_t e : ends_) lp[column_of(e)] = kNegInf;
    std::vector<int64_t> ids(static_cast<size_t>(V));
    for (int64_t v = 0; v < V; ++v) ids[v] = v;
    const int64_t k = o_.sampling_top_k > 0 ? std::min<int64_t>(o_.sampling_top_k, V) : V;
    std::partial_sort(ids.begin(), ids.begin() + k, ids.end(), [&](int64_t a, int64_t b) {
      return lp[a] > lp[b] || (lp[a] == lp[b] && a < b);
    });
    int64_t k_kept = k;
    std::vector<double> w(static_cast<size_t>(k));
    double total = 0;
    for (int64_t r = 0; r < k; ++r) {
      w[r] = std::exp((lp[ids[r]] - lp[ids[0]]) / o_.sampling_temperature);
      total += w[r];
    }
    if (o_.sampling_top_p < 1) {  // the fewest best tokens holding top_p of the probability
      const double want = static_cast<double>(o_.sampling_top_p) * total;
      double kept = 0;
      for (k_kept = 0; k_kept < k && kept < want;) kept += w[k_kept++];
      total = kept;
    }
    // A uniform double in [0, total) from 53 random bits: the same on every platform.
    const double u = static_cast<double>(rng_() >> 11) * 0x1.0p-53 * total;
    int64_t pick = ids[0];
    double acc = 0;
    for (int64_t r = 0; r < k_kept; ++r) {
      acc += w[r];
      if (u < acc) {
        pick = ids[r];
        break;
      }
    }
    const Hyp& parent = alive[i];
    const double cum = parent.cum + lp[pick];
    pick = token_of(pick);
    std::vector<Finished>& fin = sentences_[parent.sentence].finished;
    const int32_t max_length = sentences_[parent.sentence].max_decoding_length;
    if (is_end(pick)) {
      fin.push_back({parent.tokens, normalized(cum, t + 1, o_.length_penalty)});
      return;
    }
    Hyp h{parent.sentence, parent.tokens, parent.slots, cum};
    h.tokens.push_back(pick);
    if (wrote(t)) h.slots.push_back(static_cast<int64_t>(i));
    if (o_.on_token) o_.on_token(o_.user_data, parent.sentence, t, pick);
    if (t == max_length - 1) {
      fin.push_back({h.tokens, normalized(cum, max_length, o_.length_penalty)});
      return;
    }
    next.push_back(std::move(h));
  }

  kiln_model* m_;
  kiln_search_options o_;
  const bool joinable_;
  std::mt19937_64 rng_;
  std::vector<char> src_bytes_;  // encoder–decoder: the batch's sources, kept
  kiln_tensor src_{};
  int64_t layers_ = 0, max_len_ = 0, max_rows_ = 0, max_batch_ = 0, max_beam_ = 0, vocab_ = -1;
  int64_t columns_ = 0;  // logits_'s row: vocab_, or vocab_ids_.size() where restricted
  int64_t start_ = -1, end_ = -1, slots_ = 0;
  bool sampling_ = false;
  bool causal_ = false;        // decoder-only: prefill, prompts
  std::vector<int64_t> ends_;  // end_id (if any) and the stop ids
  // Vocabulary restriction: the allowed ids, sorted and unique (the ends among them), one per
  // column of logits_; end_'s column.
  bool restricted_ = false;
  std::vector<int64_t> vocab_ids_;
  int64_t end_column_ = -1;
  // The sentences being added (check_inputs): decoder-only prompts and the longest (0 for an
  // encoder–decoder), and their decoding length.
  std::vector<std::vector<int64_t>> prompts_;
  int64_t prompt_len_ = 0;
  int32_t max_decoding_length_ = 0;
  std::vector<int64_t> cache_widths_;            // each cache's last dim
  const std::vector<Hyp>* step_rows_ = nullptr;  // the hypotheses of the logits being checked
  std::vector<Buffer> mem_, cache_;
  std::vector<std::string> mem_names_, cache_names_;
  AlignedBytes logits_;              // [rows, columns_]: a step's logits
  BufferCache* kept_ = nullptr;      // the model's, for a one-call search (kiln_generate)
  std::vector<RowScan> scans_;       // per row of logits_: scan_rows
  std::vector<Sentence> sentences_;  // by id, in the order added
  std::vector<Hyp> alive_;           // the live hypotheses, grouped by sentence
  int64_t alive_sentences_ = 0;
  int64_t time_ = 0;                   // the time the next decoding step writes
  std::vector<int64_t> finished_ids_;  // finished since take_finished()
};

Generation generate(kiln_model* model, const kiln_tensor& src, const kiln_search_options& options) {
  Search search(model, options, /*joinable=*/false);
  search.add(src);  // nothing is running: never refused for room
  while (search.running()) search.step();
  return search.collect(0, search.size());
}

// ---- Joining (kiln_generator_*) ----------------------------------------------------------------

Generator::Generator(kiln_model* model, const kiln_search_options& options)
    : search_(std::make_unique<Search>(model, options, /*joinable=*/true)) {}
Generator::~Generator() = default;

std::optional<int64_t> Generator::add(const kiln_tensor& src, int32_t max_decoding_length) {
  check_usable();
  const int64_t first = search_->size();
  try {
    if (!search_->add(src, max_decoding_length)) return std::nullopt;
  } catch (...) {
    if (search_->size() != first) broken_ = true;  // failed while running the model
    throw;
  }
  return first;
}

void Generator::step() {
  check_usable();
  try {
    search_->step();
  } catch (...) {
    broken_ = true;
    throw;
  }
}

void Generator::cancel(int64_t id) {
  check_usable();
  if (id < 0 || id >= search_->size()) fail("no sentence {} in this generator", id);
  search_->cancel(id);
}

int64_t Generator::alive() const { return search_->alive(); }

std::vector<int64_t> Generator::take_finished() { return search_->take_finished(); }

Generation Generator::result(int64_t id) {
  if (id < 0 || id >= search_->size()) fail("no sentence {} in this generator", id);
  if (!search_->done(id)) fail("sentence {} is not finished", id);
  if (static_cast<int64_t>(taken_.size()) <= id) taken_.resize(static_cast<size_t>(id) + 1);
  if (taken_[static_cast<size_t>(id)]) fail("sentence {} was taken already", id);
  taken_[static_cast<size_t>(id)] = 1;
  Generation g = search_->collect(id, id + 1);
  search_->forget(id);
  return g;
}

void Generator::check_usable() const {
  if (broken_)
    fail("this generator failed in an earlier call (its sentences are lost); create another");
}

}  // namespace kiln::rt
