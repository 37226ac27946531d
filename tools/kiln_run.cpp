// kiln-run: runs compiled model libraries (kiln compile --emit=shared) for `kiln run
// --compiled DIR` and `kiln translate`, which hand their command line to it unchanged
// (tools/kiln.cpp, exec_runner). It links kiln's runtime and not the compiler: the GPU
// driver a library loads (pocl, for OpenCL) may bring its own LLVM, which crashes in a
// process that also holds libHalide's LLVM. Output, errors and exit status are kiln's.
#include <algorithm>
#include <charconv>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "kiln/vocab.h"
#include "runtime/batcher.h"
#include "runtime/vocab_map.h"
#include "support/error.h"
#include "tokenizers/tokenizer.h"
#include "tools/cli.h"
#include "tools/compiled.h"
#include "tools/serve.h"

namespace kiln::tools {
namespace {

// kiln run --compiled DIR (the options of kiln run, tools/cli.cpp).
int cmd_run(const std::vector<std::string>& argv) {
  RunArgs a;
  if (!parse_command(*run_command(a), argv)) return 0;
  if (a.compiled.empty()) fail("run: kiln-run runs compiled libraries: --compiled DIR is missing");
  if (!a.file.empty() && a.file != "-")
    fail("run: with --compiled, FILE is not used (got '{}')", a.file);
  rt::SafeTensors ifile = load_safetensors(a.inputs);
  return report_outputs(a,
                        run_compiled(a.compiled, a.function, a.weights, ifile, a.compiled_options));
}

// At most this many sentences are read from standard input (each with its translation held
// in memory until all are done): an endless input (`yes |`) is refused, not read forever.
constexpr size_t kMaxSentences = 100000;

// The tokenizer in `path` (tokenizers/tokenizer.h: a character vocabulary, a SentencePiece
// model, a byte-level BPE), errors prefixed with the command.
std::unique_ptr<kiln::tok::Tokenizer> load_vocab(const std::string& path, const char* command) {
  try {
    return kiln::tok::load_tokenizer(path);
  } catch (const kiln::Error& e) {
    fail("{}: {}", command, e.what());
  }
}

// Refuses a tokenizer that does not fit the model (its size, its special tokens' ids).
void check_vocab(const kiln::tok::Tokenizer& v, const std::string& role,
                 const CompiledGenerator& model, const char* command) {
  try {
    v.check_model(role, model.config(role == "source" ? "src_vocab" : "tgt_vocab"),
                  model.config("pad_id"), model.config("bos_id"), model.config("eos_id"));
  } catch (const kiln::Error& e) {
    fail("{}: {}", command, e.what());
  }
}

// Hands each sentence of the TEXT arguments or, without any, of standard input's lines to
// `add` as it is read (so a bad sentence stops the reading): each at most
// kiln::kMaxSentenceBytes, at most kMaxSentences of them.
void read_sentences(const char* command, const std::vector<std::string>& text,
                    const std::function<void(const std::string&)>& add) {
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i].size() > kiln::kMaxSentenceBytes)
      fail("{}: sentence {} is longer than {} bytes (the limit for a sentence): {}", command, i + 1,
           kiln::kMaxSentenceBytes, kiln::quote(text[i]));
    add(text[i]);
  }
  if (!text.empty()) return;
  std::string line;
  for (size_t n = 0;; ++n) {
    const int got = kiln::read_line(std::cin, line, kiln::kMaxSentenceBytes);
    if (got == 0) break;
    if (got < 0)
      fail(
          "{}: standard input: line {} is longer than {} bytes (the limit for a "
          "sentence): {}",
          command, n + 1, kiln::kMaxSentenceBytes, kiln::quote_start(line));
    if (n == kMaxSentences)
      fail("{}: standard input has more than {} lines (the limit for one run; split it)", command,
           kMaxSentences);
    add(line);
  }
  if (std::cin.bad()) fail("{}: cannot read standard input", command);
}

// -o of translate and generate: ids I64 [batch, hypotheses, max_len] (-1 padded), lengths and
// scores as safetensors.
void write_generation(const std::string& path, const Generated& g) {
  std::vector<rt::TensorData> data;
  data.push_back(rt::make_i64("ids", {g.batch, g.hypotheses, g.max_length}, g.ids));
  data.push_back(rt::make_i64("lengths", {g.batch, g.hypotheses}, g.lengths));
  data.push_back(rt::make_f32("scores", {g.batch, g.hypotheses}, g.scores));
  rt::write_safetensors(path, data);
}

// The ids of hypothesis `at` (sentence × hypotheses + hypothesis), without its padding.
std::vector<int64_t> hypothesis_ids(const Generated& g, int64_t at) {
  return {g.ids.begin() + at * g.max_length, g.ids.begin() + at * g.max_length + g.lengths[at]};
}

// The kernel threads in all for translate: --threads, else HL_NUM_THREADS, else the CPUs (the
// runtime's thread pool's default, runtime/thread_pool.h).
int total_kernel_threads(int threads) {
  if (threads > 0) return threads;
  if (const char* env = std::getenv("HL_NUM_THREADS"); env && *env) {
    int v = 0;
    auto [end, ec] = std::from_chars(env, env + std::strlen(env), v);
    if (ec == std::errc() && !*end && v >= 1 && v <= 256) return v;
  }
  return std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
}

// Generates for the rows of `src` [batch, width] (row i holds lengths[i] ids, then padding)
// in batches grouped by length (runtime/batcher.h: at most `max_batch_tokens` tokens and the
// model's max_batch rows each, padded with `pad` to their longest row), `workers` batches at
// once (fewer where there are fewer batches), which share `threads` kernel threads (0: leave
// the model's setting alone). With `vmap`, each batch's search is restricted to its own
// sources' candidates (kiln_search_options.vocabulary; `end_id` alone where they have
// none). The result is in the rows' order, the same translations as each row alone gives
// (with `vmap`, each row alone restricted to its batch's candidates); an error is the first
// failing batch's, naming its sentence with `sentence(i)`.
Generated generate_batched(const CompiledGenerator& model, const std::vector<int64_t>& src,
                           int64_t batch, int64_t width, const std::vector<int64_t>& lengths,
                           int64_t pad, int64_t max_batch_tokens, int workers, int threads,
                           const kiln_search_options& search,
                           const std::function<std::string(int64_t)>& sentence,
                           const rt::VocabMap* vmap = nullptr, int64_t end_id = -1) {
  struct Row {
    int64_t hypotheses = 0, max_length = 0;
    std::vector<int64_t> ids, lengths;  // [hypotheses, max_length], [hypotheses]
    std::vector<float> scores;          // [hypotheses]
  };
  const int64_t max_batch = model.symbol_max("B");
  const rt::BatchLimits limits{max_batch_tokens, std::max<int64_t>(max_batch, 0), 0};
  // A file of one batch (one sentence, say) runs on one worker with every kernel thread.
  workers = static_cast<int>(
      std::min<size_t>(static_cast<size_t>(workers), rt::group_by_length(lengths, limits).size()));
  if (threads > 0) model.set_threads(threads / std::max(workers, 1));
  std::vector<Row> rows;
  try {
    rows = rt::run_batched<Row>(lengths, limits, workers, [&](const rt::Batch& b) {
      const int64_t n = static_cast<int64_t>(b.requests.size());
      const int64_t length = std::max<int64_t>(b.length, 1);
      std::vector<int64_t> ids(static_cast<size_t>(n * length), pad);
      for (int64_t r = 0; r < n; ++r) {
        const int64_t i = static_cast<int64_t>(b.requests[r]);
        std::copy(src.begin() + i * width, src.begin() + i * width + std::min(width, length),
                  ids.begin() + r * length);
      }
      kiln_search_options o = search;
      std::vector<int64_t> allowed;
      if (vmap) {
        // The candidates of this batch's sources (vocabulary 0 would mean no restriction: with
        // none, only the end token).
        allowed = vmap->candidates(ids, n, length, pad);
        if (allowed.empty()) allowed.push_back(end_id);
        o.vocabulary = allowed.data();
        o.num_vocabulary = static_cast<int32_t>(allowed.size());
      }
      const Generated g = model.generate(ids, n, length, o, [&](int64_t row) {
        return sentence(static_cast<int64_t>(b.requests[static_cast<size_t>(row)]));
      });
      std::vector<Row> out(static_cast<size_t>(n));
      const int64_t h = g.hypotheses, m = g.max_length;
      for (int64_t r = 0; r < n; ++r) {
        Row& row = out[static_cast<size_t>(r)];
        row.hypotheses = h;
        row.max_length = m;
        row.ids.assign(g.ids.begin() + r * h * m, g.ids.begin() + (r + 1) * h * m);
        row.lengths.assign(g.lengths.begin() + r * h, g.lengths.begin() + (r + 1) * h);
        row.scores.assign(g.scores.begin() + r * h, g.scores.begin() + (r + 1) * h);
      }
      return out;
    });
  } catch (const rt::BatchError& e) {
    throw Error(e.what());
  }
  Generated out;
  out.batch = batch;
  for (const Row& row : rows) {
    KILN_ASSERT(row.hypotheses == rows[0].hypotheses && row.max_length == rows[0].max_length,
                "every batch generates the same hypotheses and max_length");
    out.hypotheses = row.hypotheses;
    out.max_length = row.max_length;
    out.ids.insert(out.ids.end(), row.ids.begin(), row.ids.end());
    out.lengths.insert(out.lengths.end(), row.lengths.begin(), row.lengths.end());
    out.scores.insert(out.scores.end(), row.scores.begin(), row.scores.end());
  }
  return out;
}

// kiln translate (see its --help).
int cmd_translate(const std::vector<std::string>& argv) {
  TranslateArgs a;
  if (!parse_command(*translate_command(a), argv)) return 0;
  const bool text = !a.src_vocab.empty() || !a.tgt_vocab.empty();
  if (text && (a.src_vocab.empty() || a.tgt_vocab.empty()))
    fail("translate: --src-vocab and --tgt-vocab go together");
  if (text == !a.inputs.empty())
    fail("translate: give either --inputs IN.safetensors or --src-vocab and --tgt-vocab");
  if (!text && !a.text.empty())
    fail("translate: TEXT arguments need --src-vocab and --tgt-vocab (got {})",
         kiln::quote(a.text[0]));

  // --inter-threads workers share the kernel threads: each gets threads / workers of them
  // (generate_batched sets them).
  const int total_threads = total_kernel_threads(a.threads);
  if (a.inter_threads > total_threads) {
    if (a.inter_threads_given)
      fail(
          "translate: --inter-threads {} is more than the {} kernel threads ({}), which the "
          "workers share: give at most {}",
          a.inter_threads, total_threads,
          a.threads > 0 ? "--threads" : "--threads not given: HL_NUM_THREADS or the CPUs",
          total_threads);
    a.inter_threads = total_threads;
  }
  const int kernel_threads = a.threads > 0 || a.inter_threads > 1 ? total_threads : 0;
  const CompiledGenerator model(a.compiled, a.weights, kernel_threads);
  if (!a.vocab_map.empty() && model.symbol_max("L") >= 0)
    fail(
        "translate: --vocab-map restricts an encoder–decoder's target vocabulary; '{}' is a "
        "decoder-only model (vocabulary restriction is for encoder–decoder models)",
        a.compiled);
  std::optional<rt::VocabMap> vmap;
  // --vocab-map in the tokens of the input: strings of the vocabularies, or ids.
  auto load_vmap = [&](rt::VocabMap::Tokens tokens) {
    tokens.source_size = model.config("src_vocab");
    tokens.target_size = model.config("tgt_vocab");
    try {
      vmap = rt::VocabMap::load(a.vocab_map, tokens);
    } catch (const kiln::Error& e) {
      fail("translate: --vocab-map: {}", e.what());
    }
  };
  std::vector<std::string> lines;
  std::unique_ptr<kiln::tok::Tokenizer> src_vocab, tgt_vocab;
  std::vector<int64_t> src;
  std::vector<int64_t> lengths;  // of each sentence, without padding
  int64_t batch = 0, length = 0, pad = -1;
  if (text) {
    src_vocab = load_vocab(a.src_vocab, "translate");
    tgt_vocab = load_vocab(a.tgt_vocab, "translate");
    const int64_t src_size = model.config("src_vocab"), tgt_size = model.config("tgt_vocab");
    if (src_size != tgt_size && src_vocab->size() == tgt_size && tgt_vocab->size() == src_size)
      fail(
          "translate: the vocabularies are swapped: --src-vocab '{}' has {} tokens and "
          "--tgt-vocab '{}' has {}, the model's src_vocab is {} and its tgt_vocab {}",
          a.src_vocab, src_vocab->size(), a.tgt_vocab, tgt_vocab->size(), src_size, tgt_size);
    check_vocab(*src_vocab, "source", model, "translate");
    check_vocab(*tgt_vocab, "target", model, "translate");
    if (!a.vocab_map.empty())
      load_vmap({[&](const std::string& t) { return src_vocab->id(t); },
                 [&](const std::string& t) { return tgt_vocab->id(t); }});
    const int64_t max_length = model.symbol_max("S");
    pad = model.config("pad_id") >= 0 ? model.config("pad_id") : src_vocab->id("<pad>");
    if (pad < 0) fail("translate: the source vocabulary has no <pad> token");
    std::vector<std::vector<int64_t>> sentences;
    read_sentences("translate", a.text, [&](const std::string& line) {
      const size_t i = lines.size();
      try {
        sentences.push_back(src_vocab->encode(line));
      } catch (const kiln::Error& e) {
        fail("translate: sentence {}: {}", i + 1, e.what());
      }
      const int64_t n = static_cast<int64_t>(sentences.back().size());
      if (n == 0) fail("translate: sentence {} is empty", i + 1);
      if (max_length > 0 && n > max_length)
        fail("translate: sentence {} has {} characters, the model reads at most {} (max_len): {}",
             i + 1, n, max_length, kiln::quote(line));
      length = std::max(length, n);
      lines.push_back(line);
    });
    batch = static_cast<int64_t>(sentences.size());
    src.assign(static_cast<size_t>(batch * length), pad);
    for (int64_t b = 0; b < batch; ++b) {
      std::copy(sentences[b].begin(), sentences[b].end(), src.begin() + b * length);
      lengths.push_back(static_cast<int64_t>(sentences[b].size()));
    }
  } else {
    if (!a.vocab_map.empty()) load_vmap({});
    rt::SafeTensors ifile = load_safetensors(a.inputs);
    const rt::TensorInfo* t = ifile.find("src");
    if (!t) fail("translate: inputs '{}' have no tensor 'src'", ifile.label());
    if (t->shape.size() != 2)
      fail("translate: 'src' must be [batch, length], got rank {}", t->shape.size());
    batch = t->shape[0];
    length = t->shape[1];
    src = ifile.to_i64(*t);
    // A row's length: up to its last id that is not the model's pad_id (at least 1).
    pad = model.config("pad_id");
    for (int64_t b = 0; b < batch; ++b) {
      int64_t n = length;
      while (pad >= 0 && n > 1 && src[static_cast<size_t>(b * length + n - 1)] == pad) --n;
      lengths.push_back(n);
    }
  }
  auto sentence = [&](int64_t i) {
    if (text)
      return fmt::format("translate: sentence {} {}", i + 1,
                         kiln::quote(lines[static_cast<size_t>(i)]));
    return fmt::format("translate: row {} of 'src'", i);
  };
  // No sentence: the runtime's error for an empty batch, as before.
  const int64_t end_id = a.search.end_id >= 0 ? a.search.end_id : model.config("eos_id");
  Generated g = batch == 0 ? model.generate(src, batch, length, a.search, sentence)
                           : generate_batched(model, src, batch, length, lengths, pad,
                                              a.max_batch_tokens, a.inter_threads, kernel_threads,
                                              a.search, sentence, vmap ? &*vmap : nullptr, end_id);
  if (!a.output.empty()) {
    write_generation(a.output, g);
    return 0;
  }
  std::string printed;
  for (int64_t b = 0; b < g.batch; ++b)
    for (int64_t h = 0; h < g.hypotheses; ++h) {
      const int64_t at = b * g.hypotheses + h;
      const std::vector<int64_t> ids = hypothesis_ids(g, at);
      if (text) {
        std::string translation;
        try {
          translation = tgt_vocab->decode(ids);
        } catch (const std::runtime_error& e) {
          fail("translate: the model generated {}", e.what());
        }
        printed += fmt::format("{}{} -> {}", h ? "  " : "", h ? "" : lines[b], translation);
        if (a.scores || g.hypotheses > 1) printed += fmt::format("  (score {:.4f})", g.scores[at]);
        printed += "\n";
      } else {
        printed += fmt::format("sentence {} hypothesis {}: score {:.6f} ids [{}]\n", b, h,
                               g.scores[at], fmt::join(ids, ", "));
      }
    }
  write_output("-", printed);
  return 0;
}

// kiln generate (see its --help).
int cmd_generate(const std::vector<std::string>& argv) {
  GenerateArgs a;
  if (!parse_command(*generate_command(a), argv)) return 0;
  const CompiledGenerator model(a.compiled, a.weights, a.threads);
  // A decoder-only model continues prompts (padded with -1); an encoder–decoder generates from
  // sources (padded with its pad_id, ids checked against the source vocabulary if it names one).
  const bool causal = model.symbol_max("L") >= 0;
  const int64_t pad = causal ? -1 : model.config("pad_id");
  if (!causal && pad < 0)
    fail(
        "generate: '{}' is neither a decoder-only model (nn::add_causal_lm) nor an "
        "encoder–decoder with a pad_id (nn::add_seq2seq)",
        a.compiled);
  std::vector<std::vector<int64_t>> prompts;
  std::vector<std::string> lines;
  int64_t length = 0;
  const int64_t vocab = model.config(causal ? "vocab" : "src_vocab");
  std::unique_ptr<kiln::tok::Tokenizer> tokenizer;
  if (!a.tokenizer.empty() && !causal)
    fail(
        "generate: --tokenizer is for decoder-only models (one vocabulary for prompts and "
        "output); '{}' is an encoder-decoder: use kiln translate with --src-vocab and "
        "--tgt-vocab",
        a.compiled);
  if (!a.tokenizer.empty()) {
    tokenizer = load_vocab(a.tokenizer, "generate");
    if (vocab > 0 && tokenizer->size() > vocab)
      fail("generate: tokenizer '{}' has {} tokens, more than the model's {} ({})", a.tokenizer,
           tokenizer->size(), causal ? "vocab" : "src_vocab", vocab);
  }
  read_sentences("generate", a.prompts, [&](const std::string& line) {
    const size_t i = prompts.size();
    std::vector<int64_t> ids;
    if (tokenizer) {
      try {
        ids = tokenizer->encode(line);
      } catch (const kiln::Error& e) {
        fail("generate: prompt {}: {}", i + 1, e.what());
      }
      if (ids.empty()) fail("generate: prompt {} is empty", i + 1);
      length = std::max<int64_t>(length, static_cast<int64_t>(ids.size()));
      prompts.push_back(std::move(ids));
      lines.push_back(line);
      return;
    }
    std::istringstream in(line);
    std::string word;
    while (in >> word) {
      int64_t id = 0;
      auto [end, ec] = std::from_chars(word.data(), word.data() + word.size(), id);
      if (ec != std::errc() || end != word.data() + word.size() || id < 0)
        fail(
            "generate: prompt {}: '{}' is not a token id (prompts are token ids separated by "
            "spaces): {}",
            i + 1, word, kiln::quote(line));
      if (vocab > 0 && id >= vocab)
        fail("generate: prompt {}: token id {} is out of range [0, {}) (the model's vocab): {}",
             i + 1, id, vocab, kiln::quote(line));
      ids.push_back(id);
    }
    if (ids.empty()) fail("generate: prompt {} is empty", i + 1);
    length = std::max<int64_t>(length, static_cast<int64_t>(ids.size()));
    prompts.push_back(std::move(ids));
    lines.push_back(line);
  });
  if (prompts.empty())
    fail("generate: no prompt (give PROMPT arguments or lines on standard input)");
  const int64_t batch = static_cast<int64_t>(prompts.size());
  if (a.stream && (batch != 1 || a.search.beam_size != 1 || a.output.size()))
    fail(
        "generate: --stream prints one prompt's tokens as they come: it needs one prompt, "
        "--beam 1 and no -o");
  std::vector<int64_t> src(static_cast<size_t>(batch * length), pad);
  for (int64_t b = 0; b < batch; ++b)
    std::copy(prompts[b].begin(), prompts[b].end(), src.begin() + b * length);
  a.search.stop_ids = a.stop_ids.data();
  a.search.num_stop_ids = static_cast<int32_t>(a.stop_ids.size());
  auto prompt = [&](int64_t i) {
    return fmt::format("generate: prompt {} {}", i + 1, kiln::quote(lines[static_cast<size_t>(i)]));
  };
  std::function<void(int64_t, int64_t)> stream;
  std::optional<kiln::tok::StreamDecoder> text_stream;
  if (a.stream && tokenizer) {
    text_stream.emplace(*tokenizer);
    stream = [&](int64_t, int64_t token) {
      fmt::print("{}", text_stream->push(token));
      std::fflush(stdout);
    };
  } else if (a.stream) {
    stream = [](int64_t, int64_t token) {
      fmt::print("{} ", token);
      std::fflush(stdout);
    };
  }
  Generated g = model.generate(src, batch, length, a.search, prompt, stream);
  if (!a.output.empty()) {
    write_generation(a.output, g);
    return 0;
  }
  if (a.stream) {
    write_output("-", (text_stream ? text_stream->finish() : "") + "\n");
    return 0;
  }
  std::string printed;
  for (int64_t b = 0; b < g.batch; ++b)
    for (int64_t h = 0; h < g.hypotheses; ++h) {
      const int64_t at = b * g.hypotheses + h;
      const std::vector<int64_t> ids = hypothesis_ids(g, at);
      if (tokenizer)
        printed += fmt::format("{}{}", h ? "  " : "", tokenizer->decode(ids));
      else
        printed += fmt::format("{}{}", h ? "  " : "", fmt::join(ids, " "));
      if (a.scores || g.hypotheses > 1) printed += fmt::format("  (score {:.4f})", g.scores[at]);
      printed += "\n";
    }
  write_output("-", printed);
  return 0;
}

// kiln pack-weights (tools/cli.cpp declares its options).
int cmd_pack_weights(const std::vector<std::string>& argv) {
  PackWeightsArgs a;
  if (!parse_command(*pack_weights_command(a), argv)) return 0;
  pack_weights(a.compiled, a.weights, a.output);
  return 0;
}

int dispatch(const std::vector<std::string>& args) {
  if (!args.empty() && args[0] == "run") return cmd_run({args.begin() + 1, args.end()});
  if (!args.empty() && args[0] == "pack-weights")
    return cmd_pack_weights({args.begin() + 1, args.end()});
  if (!args.empty() && args[0] == "translate") return cmd_translate({args.begin() + 1, args.end()});
  if (!args.empty() && args[0] == "generate") return cmd_generate({args.begin() + 1, args.end()});
  if (!args.empty() && args[0] == "serve") return cmd_serve({args.begin() + 1, args.end()});
  fail(
      "kiln-run runs compiled models for 'kiln run --compiled DIR', 'kiln translate' and "
      "'kiln generate', 'kiln serve' and 'kiln pack-weights'; "
      "use those (see 'kiln run --help')");
}

}  // namespace
}  // namespace kiln::tools

int main(int argc, char** argv) { return kiln::tools::run_main(argc, argv, kiln::tools::dispatch); }
