// What kiln and kiln-run share (see cli.h).
#include "tools/cli.h"

#include <algorithm>
#include <charconv>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <span>
#include <sstream>
#include <string_view>

#include <fmt/format.h>

#include "kiln/vocab.h"  // quote: user text in messages, cut to a prefix and its length
#include "runtime/weights.h"
#include "support/file_io.h"
#include "support/read_file.h"

namespace kiln::tools {

namespace {

// kiln's help layout (see make_command).
class HelpFormatter : public CLI::Formatter {
 public:
  explicit HelpFormatter(std::string usage) : usage_(std::move(usage)) {}

  std::string make_help(const CLI::App* app, std::string, CLI::AppFormatMode) const override {
    // "usage: kiln NAME " and the usage: its later lines under its first's arguments, or
    // under "kiln" for those that start "kiln " (another form of the command).
    const std::string head = fmt::format("usage: kiln {} ", app->get_name());
    std::string out = head;
    for (size_t pos = 0, end = 0; pos <= usage_.size(); pos = end + 1) {
      end = std::min(usage_.find('\n', pos), usage_.size());
      const std::string line = usage_.substr(pos, end - pos);
      if (pos > 0) out += "\n" + std::string(line.rfind("kiln ", 0) == 0 ? 7 : head.size(), ' ');
      out += line;
    }
    out += "\n\n" + app->get_description() + "\n";
    for (const std::string& group : app->get_groups()) {
      std::vector<const CLI::Option*> opts = app->get_options([&](const CLI::Option* o) {
        return o->get_group() == group && o->nonpositional() && o != app->get_help_ptr();
      });
      if (opts.empty()) continue;
      out += fmt::format("\n{}:\n", group == "Options" ? "options" : group);
      for (const CLI::Option* o : opts) out += option_line(o);
    }
    if (!app->get_footer().empty()) out += "\n" + app->get_footer();
    return out;
  }

 private:
  // "  --name VALUE       help (default: X)", the help wrapped at 100 columns under itself.
  static std::string option_line(const CLI::Option* o) {
    constexpr size_t kColumn = 24, kWidth = 100;
    std::string names = "  " + o->get_name(false, true);
    if (o->get_type_size() != 0 && !o->get_type_name().empty()) names += " " + o->get_type_name();
    std::string help = o->get_description();
    if (o->get_required()) help += " (required)";
    if (!o->get_default_str().empty()) help += fmt::format(" (default: {})", o->get_default_str());
    std::string out = names;
    size_t col = out.size();
    if (col + 2 > kColumn) {
      out += "\n";
      col = 0;
    }
    out += std::string(kColumn - col, ' ');
    col = kColumn;
    std::istringstream words(help);
    std::string word;
    bool first = true;
    while (words >> word) {
      if (!first && col + 1 + word.size() > kWidth) {
        out += "\n" + std::string(kColumn, ' ');
        col = kColumn;
      } else if (!first) {
        out += ' ';
        ++col;
      }
      out += word;
      col += word.size();
      first = false;
    }
    return out + "\n";
  }

  std::string usage_;
};

// The option named in a CLI11 message "NAME: ..." or "NAME requires ...".
std::string option_in(const std::string& message, const std::string& separator) {
  const size_t at = message.find(separator);
  return at == std::string::npos ? std::string() : message.substr(0, at);
}

}  // namespace

std::unique_ptr<CLI::App> make_command(const std::string& name, const std::string& usage,
                                       const std::string& description) {
  auto app = std::make_unique<CLI::App>(description, name);
  app->formatter(std::make_shared<HelpFormatter>(usage));
  // Unknown options are reported by parse_command (by name); a value per occurrence, the last
  // counting, as options of compilers go.
  app->allow_extras();
  app->option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  return app;
}

bool parse_command(CLI::App& app, const std::vector<std::string>& argv) {
  const std::string command = app.get_name();
  std::vector<std::string> reversed(argv.rbegin(), argv.rend());  // CLI11 takes them so
  try {
    app.parse(reversed);
  } catch (const CLI::CallForHelp&) {
    write_output("-", app.help());
    return false;
  } catch (const CLI::ValidationError& e) {  // "--atol: must be a number, got '1e-4junk'"
    const std::string name = option_in(e.what(), ": ");
    fail("{}: {} {}", command, name, std::string(e.what()).substr(name.size() + 2));
  } catch (const CLI::RequiresError& e) {  // "--profile requires --compiled"
    const std::string name = option_in(e.what(), " requires ");
    const std::string needed = std::string(e.what()).substr(name.size() + 10);
    const CLI::Option* o = app.get_option_no_throw(needed);
    fail("{}: {} needs {}{}", command, name, needed,
         o && !o->get_type_name().empty() ? " " + o->get_type_name() : "");
  } catch (const CLI::RequiredError& e) {  // "--weights is required"
    fail("{}: {} (see 'kiln {} --help')", command, e.what(), command);
  } catch (const CLI::ArgumentMismatch& e) {  // "--weights: 1 required TEXT missing"
    fail("{}: option '{}' needs a value", command, option_in(e.what(), ":"));
  } catch (const CLI::ParseError& e) {
    fail("{}: {}", command, e.what());
  }
  for (const std::string& extra : app.remaining()) {
    if (extra.size() > 1 && extra[0] == '-')
      fail("{}: unknown option {} (see 'kiln {} --help')", command,
           kiln::quote(extra.substr(0, extra.find('='))), command);
    fail("{}: unexpected argument {} (see 'kiln {} --help')", command, kiln::quote(extra), command);
  }
  return true;
}

CLI::Validator whole_number(int64_t lo, int64_t hi) {
  const std::string what = fmt::format("a whole number in [{}, {}]", lo, hi);
  return CLI::Validator(
      [=](std::string& value) -> std::string {
        int64_t v = 0;
        auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
        if (ec != std::errc() || end != value.data() + value.size() || v < lo || v > hi)
          return fmt::format("must be {}, got {}", what, kiln::quote(value));
        return "";
      },
      "");  // no description: the help shows only the value's name
}

CLI::Validator at_least(int64_t lo) {
  CLI::Validator v = whole_number(lo, INT32_MAX);
  const std::string what = fmt::format("a whole number >= {}", lo);
  return CLI::Validator(
      [=](std::string& value) -> std::string {
        return v(value).empty() ? "" : fmt::format("must be {}, got {}", what, kiln::quote(value));
      },
      "");
}

std::optional<int64_t> parse_byte_size(const std::string& text) {
  int64_t v = 0;
  const char* end = text.data() + text.size();
  auto [p, ec] = std::from_chars(text.data(), end, v);
  if (ec != std::errc() || p == text.data() || v <= 0) return std::nullopt;
  int shift = 0;
  if (p != end) {
    const std::string_view suffix(p, static_cast<size_t>(end - p));
    if (suffix == "K")
      shift = 10;
    else if (suffix == "M")
      shift = 20;
    else if (suffix == "G")
      shift = 30;
    else if (suffix == "T")
      shift = 40;
    else
      return std::nullopt;
  }
  if (v > (int64_t{1} << (62 - shift))) return std::nullopt;
  return v << shift;
}

CLI::Validator byte_size() {
  return CLI::Validator(
      [](std::string& value) -> std::string {
        return parse_byte_size(value)
                   ? ""
                   : fmt::format(
                         "must be a size in bytes such as 512M or 16G (suffixes K, M, G, "
                         "T), got '{}'",
                         value);
      },
      "");
}

CLI::Validator finite_number() {
  return CLI::Validator(
      [](std::string& value) -> std::string {
        double v = 0;
        auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
        if (ec != std::errc() || end != value.data() + value.size() || !std::isfinite(v))
          return fmt::format("must be a number, got {}", kiln::quote(value));
        return "";
      },
      "");
}

std::unique_ptr<CLI::App> run_command(RunArgs& a) {
  auto app = make_command(
      "run",
      "FILE --weights W.safetensors --inputs IN.safetensors [--function NAME]\n"
      "[-o OUT.safetensors] [--expect EXPECTED.safetensors [--atol X]]\n"
      "[--bf16-linear | --int8-linear] [--bf16-products dot|fma]\n"
      "kiln run --compiled DIR --weights W.safetensors --inputs IN.safetensors [...]\n"
      "[--threads N] [--repeat N] [--profile]",
      "Runs a function with the reference interpreter. Inputs are read by parameter name\n"
      "(ids as I32 or I64, checked against the vocabulary); outputs are written by result "
      "name.");
  app->add_option("FILE", a.file, "the module ('-': standard input)");
  app->add_option("--weights", a.weights, "weights by state_dict name")
      ->type_name("FILE")
      ->required();
  app->add_option("--inputs", a.inputs, "inputs by parameter name")->type_name("FILE")->required();
  app->add_option("--function", a.function, "entry point to run")
      ->type_name("NAME")
      ->capture_default_str();
  app->add_option("-o", a.output, "write the outputs as safetensors; without it, print a summary")
      ->type_name("FILE");
  app->add_option("--expect", a.expect,
                  "compare outputs with the same-named tensors of FILE; exit 1 when the max abs "
                  "error exceeds --atol")
      ->type_name("FILE");
  app->add_option("--atol", a.atol, "tolerance for --expect")
      ->type_name("X")
      ->check(finite_number())
      ->capture_default_str();
  CLI::Option* compiled =
      app->add_option("--compiled", a.compiled,
                      "run the shared library that 'kiln compile --emit=shared' wrote in DIR "
                      "instead of the interpreter (FILE is then not needed: pass '-' or omit it)")
          ->type_name("DIR");
  CompiledRunOptions& c = a.compiled_options;
  app->add_option("--threads", c.threads,
                  "kernel threads for --compiled (default: the Halide "
                  "runtime's)")
      ->type_name("N")
      ->check(at_least(1))
      ->needs(compiled);
  app->add_option("--repeat", c.repeat, "with --compiled: run N times (outputs from the last run)")
      ->type_name("N")
      ->check(at_least(1))
      ->needs(compiled);
  app->add_flag("--profile", c.profile,
                "with --compiled: print the time per entry-point run and per kernel (calls, "
                "total, per call, share) to stderr")
      ->needs(compiled);
  app->add_option("--max-memory", a.max_memory,
                  "interpreter only: refuse a run whose values need more than SIZE bytes at once "
                  "(suffixes K, M, G, T), before it starts")
      ->type_name("SIZE")
      ->check(byte_size())
      ->capture_default_str();
  app->add_flag("--bf16-linear", a.bf16_linear,
                "interpreter only: every linear op rounds its input and weight to bf16 first, "
                "and every attention op (even head size) its q, k, probabilities and v, as a "
                "library compiled with '--weights bf16' does (run it on that library's "
                "optimized IR, 'kiln compile --emit=ir')");
  app->add_option("--bf16-products", a.bf16_products,
                  "with --bf16-linear or --int8-linear: 'dot' (the default) rounds attention's "
                  "q, k, probabilities and v to bf16 too, 'fma' leaves attention in f32, as a "
                  "library compiled with '--weights bf16|int8 --bf16-products dot|fma' runs it (a "
                  "library compiled with 'auto' names the form it runs in its config key "
                  "bf16_products)")
      ->type_name("dot|fma")
      ->check(CLI::IsMember({"dot", "fma"}));
  app->add_flag("--int8-linear", a.int8_linear,
                "interpreter only: every linear op quantizes its weight and each row of its "
                "input to int8 (symmetric, scale max|row| / 127) and sums the products exactly, "
                "as a library compiled with '--weights int8' does, and every attention op (even "
                "head size) in bf16 as with --bf16-linear, unless --bf16-products fma (run it on "
                "that library's optimized IR)")
      ->excludes("--bf16-linear");
  return app;
}

// The search options (kiln_search_options, as kiln_search_options_init filled it: the defaults
// shown are the C ABI's), for translate and generate (`prompts`: a decoder-only model's, with
// no start token). Stop ids go to `stop_ids`, which the caller points the options at.
static void add_search_options(CLI::App& app, kiln_search_options& s, bool prompts,
                               std::vector<int64_t>* stop_ids = nullptr) {
  const std::string search = "search options";
  app.add_option("--beam", s.beam_size, "beam size (1: greedy), at most the model's max_beam")
      ->type_name("N")
      ->check(whole_number(0, INT32_MAX))
      ->capture_default_str()
      ->group(search);
  app.add_option("--num-hypotheses", s.num_hypotheses,
                 "hypotheses per sentence, at most the beam size")
      ->type_name("N")
      ->check(whole_number(0, INT32_MAX))
      ->capture_default_str()
      ->group(search);
  app.add_option("--max-len", s.max_decoding_length,
                 prompts ? "new tokens at most, end token included; 0: up to the model's max_len"
                         : "tokens to generate at most, end token included; 0: the model's max_len")
      ->type_name("N")
      ->check(whole_number(0, INT32_MAX))
      ->capture_default_str()
      ->group(search);
  app.add_option("--min-len", s.min_decoding_length, "tokens before the end token may be generated")
      ->type_name("N")
      ->check(whole_number(0, INT32_MAX))
      ->capture_default_str()
      ->group(search);
  app.add_option("--length-penalty", s.length_penalty, "scores are divided by length^X")
      ->type_name("X")
      ->check(finite_number())
      ->capture_default_str()
      ->group(search);
  if (!prompts)
    app.add_option("--start-id", s.start_id, "first decoder token; -1: the model's bos_id")
        ->type_name("ID")
        ->check(whole_number(-1, INT64_MAX))
        ->capture_default_str()
        ->group(search);
  app.add_option("--end-id", s.end_id, "end token; -1: the model's eos_id")
      ->type_name("ID")
      ->check(whole_number(-1, INT64_MAX))
      ->capture_default_str()
      ->group(search);
  app.add_option(
         "--sampling-topk", s.sampling_top_k,
         "sample from the K most likely tokens (0: all; 1: no sampling); sampling needs --beam 1")
      ->type_name("K")
      ->check(whole_number(0, INT32_MAX))
      ->capture_default_str()
      ->group(search);
  app.add_option("--top-p", s.sampling_top_p,
                 "sample from the fewest most likely tokens holding probability X (1: all)")
      ->type_name("X")
      ->check(finite_number())
      ->capture_default_str()
      ->group(search);
  app.add_option("--temperature", s.sampling_temperature, "sampling temperature")
      ->type_name("X")
      ->check(finite_number())
      ->capture_default_str()
      ->group(search);
  app.add_option("--seed", s.seed, "sampling seed: the same seed gives the same output")
      ->type_name("N")
      ->check(whole_number(0, INT64_MAX))
      ->capture_default_str()
      ->group(search);
  if (stop_ids)
    app.add_option("--stop-id", *stop_ids, "more end tokens besides --end-id (repeatable)")
        ->type_name("ID")
        ->check(whole_number(0, INT64_MAX))
        ->group(search);
}

// The options of GeneratorArgs: --compiled, --weights, -o, --threads, --scores.
static void add_generator_options(CLI::App& app, GeneratorArgs& a, const char* scores,
                                  const char* threads =
                                      "kernel threads (default: the Halide "
                                      "runtime's)") {
  app.add_option("--compiled", a.compiled,
                 "the directory 'kiln compile --emit=shared' wrote (its lib*.so)")
      ->type_name("DIR")
      ->required();
  app.add_option("--weights", a.weights, "weights by state_dict name")
      ->type_name("FILE")
      ->required();
  app.add_option("-o", a.output, "write ids, lengths and scores as safetensors")->type_name("FILE");
  app.add_option("--threads", a.threads, threads)->type_name("N")->check(whole_number(1, 1024));
  app.add_flag("--scores", a.scores, scores);
}

std::unique_ptr<CLI::App> translate_command(TranslateArgs& a) {
  auto app = make_command(
      "translate",
      "--compiled DIR --weights W.safetensors\n"
      "(--inputs IN.safetensors | --src-vocab V --tgt-vocab V [TEXT...])\n"
      "[--beam N] [--num-hypotheses N] [--max-len N] [--min-len N]\n"
      "[--length-penalty X] [--start-id ID] [--end-id ID]\n"
      "[--sampling-topk K] [--top-p X] [--temperature X] [--seed N]\n"
      "[--threads N] [--inter-threads N] [--max-batch-tokens N] [--vocab-map FILE]\n"
      "[--scores] [-o OUT.safetensors]",
      "Generates target sentences with a compiled model (from 'kiln compile --emit=shared'), "
      "over\nits prepare and decode_step entry points: greedy search, beam search or sampling.\n"
      "\n"
      "Input: the source ids of --inputs (tensor 'src', [batch, length], padded with the model's\n"
      "pad_id), or text with --src-vocab and --tgt-vocab: each TEXT argument, or without any,\n"
      "each line of standard input, is a source sentence; one line 'SOURCE -> TRANSLATION' is\n"
      "printed per sentence (and per hypothesis with --num-hypotheses). A vocabulary is a\n"
      "character-level file, one token per line (see examples/numbers/README.md), a\n"
      "SentencePiece model (*.model), or a byte-level BPE (vocab.json, merges.txt beside it);\n"
      "it must fit the model: as many tokens as its src_vocab and tgt_vocab, <pad> at its\n"
      "pad_id, <s> and </s> at its bos_id and eos_id (where the vocabulary has them). Limits: a\n"
      "character vocabulary line of 4096 bytes, 1048576 tokens;\n"
      "a sentence of 1048576 bytes, 100000 lines of standard input. Text that is not UTF-8 and\n"
      "a NaN or infinite logit are errors.\n"
      "\n"
      "Batches: the sentences are sorted by length and cut into batches of at most\n"
      "--max-batch-tokens tokens (rows times the batch's longest source) and the model's\n"
      "max_batch rows; --inter-threads batches are translated at once, each on a worker of its\n"
      "own with --threads / --inter-threads kernel threads (one pool per process: while one\n"
      "worker's kernel holds it, another's runs on that worker's thread alone). The output\n"
      "keeps the input's order and holds the same translations as translating each sentence\n"
      "alone (scores may differ in a float's last bits; sampling starts from --seed in each\n"
      "batch, so its samples depend on the batches). An error names a sentence of the first\n"
      "batch that failed.\n"
      "\n"
      "Vocabulary restriction: with --vocab-map FILE (CTranslate2's vmap format), each batch\n"
      "chooses its target tokens only among the candidates of its own sources (so a\n"
      "translation may depend on its batch's other sentences). Each line of\n"
      "FILE is 'SOURCE<TAB>TARGETS': SOURCE a source token or an n-gram of them, TARGETS the\n"
      "target tokens it allows, both separated by spaces; a line with an empty SOURCE lists\n"
      "tokens always allowed. The tokens are those of --src-vocab and --tgt-vocab with text,\n"
      "integer ids with --inputs. The end token is always allowed. The search is the one over\n"
      "all tokens with every other token's logit -inf, run over the model's\n"
      "decode_step_restricted (an encoder-decoder compiled by this kiln).\n"
      "\n"
      "Output: with -o, a safetensors file with 'ids' I64 [batch, hypotheses, max_len] (-1 "
      "after\neach hypothesis), 'lengths' I64 [batch, hypotheses] and 'scores' F32 [batch, "
      "hypotheses];\nwithout -o and without vocabularies, each hypothesis's ids and score are "
      "printed.");
  app->add_option("TEXT", a.text, "source sentences (with --src-vocab and --tgt-vocab)");
  add_generator_options(*app, a, "with text, print each translation's score too",
                        "kernel threads in all, shared by the --inter-threads workers (default: "
                        "the number of CPUs)");
  app->add_option("--inputs", a.inputs, "source ids: tensor 'src' I64 or I32 [batch, length]")
      ->type_name("FILE");
  app->add_option("--src-vocab", a.src_vocab,
                  "source vocabulary: characters (one per line), a SentencePiece .model or a BPE "
                  "vocab.json")
      ->type_name("V");
  app->add_option("--tgt-vocab", a.tgt_vocab,
                  "target vocabulary: characters (one per line), a SentencePiece .model or a BPE "
                  "vocab.json")
      ->type_name("V");
  app->add_option("--vocab-map", a.vocab_map,
                  "restrict each batch's target tokens to its sources' candidates in FILE "
                  "(lines SOURCE<TAB>TARGETS; see above)")
      ->type_name("FILE");
  app->add_option("--max-batch-tokens", a.max_batch_tokens,
                  "a batch holds at most N tokens: its rows times its longest source (a longer "
                  "sentence runs alone)")
      ->type_name("N")
      ->check(whole_number(1, INT64_MAX))
      ->capture_default_str();
  app->add_option("--inter-threads", a.inter_threads,
                  "batches translated at once, each by a worker with at most --threads / N "
                  "(rounded down) kernel threads; N at most --threads (without it, the number of "
                  "CPUs)")
      ->type_name("N")
      ->check(whole_number(1, 1024))
      ->capture_default_str()
      ->each([&a](const std::string&) { a.inter_threads_given = true; });
  add_search_options(*app, a.search, /*prompts=*/false);
  return app;
}

std::unique_ptr<CLI::App> generate_command(GenerateArgs& a) {
  auto app = make_command(
      "generate",
      "--compiled DIR --weights W.safetensors [PROMPT...]\n"
      "[--beam N] [--num-hypotheses N] [--max-len N] [--min-len N] [--length-penalty X]\n"
      "[--end-id ID] [--stop-id ID]... [--sampling-topk K] [--top-p X] [--temperature X]\n"
      "[--seed N] [--stream] [--tokenizer FILE] [--threads N] [--scores] [-o OUT.safetensors]",
      "Continues prompts with a compiled decoder-only model (from 'kiln compile --emit=shared' of\n"
      "a model built with nn::add_causal_lm, over its prefill and decode_step entry points), or\n"
      "generates from sources with an encoder-decoder (nn::add_seq2seq: prepare and\n"
      "decode_step): greedy search, beam search or sampling (top-k, top-p, temperature).\n"
      "\n"
      "Input: token ids. Each PROMPT argument, or without any, each line of standard input, is\n"
      "one prompt (or source): token ids separated by spaces, or text with --tokenizer (a\n"
      "SentencePiece .model, a byte-level BPE vocab.json with merges.txt beside it, or a\n"
      "character vocabulary). Prompts of different lengths run in one batch (up to the model's\n"
      "max_batch at a time).\n"
      "\n"
      "Output: one line per prompt (and per hypothesis with --num-hypotheses): the new token\n"
      "ids, the end token left out (text with --tokenizer); with --stream (greedy or sampling,\n"
      "one prompt) each id (or its text, whole UTF-8 characters only) is printed as soon as it\n"
      "is chosen. With -o, a safetensors file with 'ids' I64 [batch,\n"
      "hypotheses, max_len] (-1 after each hypothesis), 'lengths' and 'scores'.");
  app->add_option("PROMPT", a.prompts,
                  "prompts (or sources): token ids separated by spaces, or text with --tokenizer");
  add_generator_options(*app, a, "print each hypothesis's score too");
  app->add_option("--tokenizer", a.tokenizer,
                  "tokenizer for text prompts and output: a SentencePiece .model, a BPE "
                  "vocab.json (merges.txt beside it) or a character vocabulary")
      ->type_name("FILE");
  app->add_flag("--stream", a.stream, "print each token as it is chosen (one prompt, beam 1)");
  add_search_options(*app, a.search, /*prompts=*/true, &a.stop_ids);
  return app;
}

std::unique_ptr<CLI::App> pack_weights_command(PackWeightsArgs& a) {
  auto app = make_command(
      "pack-weights", "--compiled DIR --weights W.safetensors -o OUT.kiln-weights",
      "Writes a compiled model's weights as its runtime lays them out (linear weights\n"
      "transposed or packed, bf16 and int8 converted) into one file. Given as the weights of\n"
      "the model (--weights, kiln.Model, kiln serve), it is mapped read-only, not copied: every\n"
      "process that loads it on one machine shares one copy of the weights in memory. It fits\n"
      "only the library it was written with (the same weights layout: refused otherwise), and\n"
      "holds the weights themselves: write it again when the checkpoint changes. The file is\n"
      "replaced, never rewritten in place (a process mapping the old one keeps reading it).");
  app->add_option("--compiled", a.compiled,
                  "directory from 'kiln compile --emit=shared' (or its lib*.so)")
      ->type_name("DIR")
      ->required();
  app->add_option("--weights", a.weights,
                  "the checkpoint: a safetensors file, or a sharded checkpoint's index or folder")
      ->type_name("FILE")
      ->required();
  app->add_option("-o", a.output, "the laid-out weights file to write")
      ->type_name("OUT")
      ->required();
  return app;
}

void write_output(const std::string& path, const std::string& text) {
  if (path.empty() || path == "-")
    write_stdout(text);
  else
    write_file_atomically(path, text);
}

void print_error(const Error& e) {
  std::fflush(stdout);
  fmt::print(stderr, "kiln: error: {}\n", e.what());
}

std::vector<uint8_t> read_bytes(const std::string& path) { return read_input_file(path); }

std::string read_text(const std::string& path) {
  std::vector<uint8_t> b = read_bytes(path);
  return std::string(b.begin(), b.end());
}

rt::SafeTensors load_safetensors(const std::string& path) {
  if (path == "-") return rt::SafeTensors::from_bytes(read_bytes(path), "<stdin>");
  return rt::SafeTensors::load(path);
}

int report_outputs(const RunArgs& a, const std::vector<rt::TensorData>& data) {
  // Outputs as f32 for summaries and comparisons (integer outputs are summarized by shape).
  auto floats = [](const rt::TensorData& t) {
    std::vector<float> v(t.data.size() / 4);
    std::memcpy(v.data(), t.data.data(), v.size() * 4);
    return v;
  };

  if (!a.output.empty()) {
    rt::write_safetensors(a.output, data);
    fmt::print(stderr, "wrote {} output(s) to {}\n", data.size(), a.output);
  } else if (a.expect.empty()) {
    for (const rt::TensorData& t : data) {
      if (t.dtype != rt::DType::f32) {
        fmt::print("{}: {} {}\n", t.name, rt::dtype_name(t.dtype), rt::shape_string(t.shape));
        continue;
      }
      std::vector<float> v = floats(t);
      double lo = INFINITY, hi = -INFINITY, sum = 0;
      for (float x : v) lo = std::min<double>(lo, x), hi = std::max<double>(hi, x), sum += x;
      fmt::print("{}: f32{} min {:.6g} max {:.6g} mean {:.6g}\n", t.name, rt::shape_string(t.shape),
                 lo, hi, v.empty() ? 0.0 : sum / v.size());
    }
  }
  if (!a.expect.empty()) {
    const std::string& expect_path = a.expect;
    const double atol = a.atol;
    rt::SafeTensors expected = load_safetensors(expect_path);
    bool ok = true;
    for (const rt::TensorData& t : data) {
      const rt::TensorInfo& e = expected.at(t.name);
      if (e.shape != t.shape)
        fail("run: output '{}' has shape {}, expected {}", t.name, rt::shape_string(t.shape),
             rt::shape_string(e.shape));
      if (t.dtype != rt::DType::f32) {
        // Ids and masks: exact. The expected tensor may be I64 or I32 for ids.
        std::vector<int64_t> got(t.data.size() / rt::dtype_size(t.dtype));
        for (size_t j = 0; j < got.size(); ++j)
          got[j] = t.dtype == rt::DType::i64 ? reinterpret_cast<const int64_t*>(t.data.data())[j]
                                             : t.data[j];
        std::vector<int64_t> want;
        if (e.dtype == rt::DType::boolean || e.dtype == rt::DType::u8) {
          std::span<const uint8_t> b = expected.bytes(e);
          want.assign(b.begin(), b.end());
        } else {
          want = expected.to_i64(e);
        }
        int64_t differ = 0;
        for (size_t j = 0; j < got.size(); ++j) differ += got[j] != want[j];
        ok &= differ == 0;
        fmt::print("{}: {} of {} elements differ vs {} ({})\n", t.name, differ, got.size(),
                   expect_path, differ == 0 ? "match" : "MISMATCH");
        continue;
      }
      // NaN or an infinity matches only the same value in the expected tensor.
      std::vector<float> want = expected.to_f32(e), got = floats(t);
      double err = 0;
      int64_t non_finite = 0;
      for (size_t j = 0; j < want.size() && j < got.size(); ++j) {
        if (!std::isfinite(got[j]) || !std::isfinite(want[j])) {
          const bool same = (std::isnan(got[j]) && std::isnan(want[j])) || got[j] == want[j];
          non_finite += !same;
          continue;
        }
        err = std::max(err, std::abs(static_cast<double>(got[j]) - want[j]));
      }
      bool pass = err <= atol && non_finite == 0;
      ok &= pass;
      if (non_finite)
        fmt::print("{}: {} NaN or infinite element(s) where {} has another value (MISMATCH)\n",
                   t.name, non_finite, expect_path);
      fmt::print("{}: max abs error {:.3g} vs {} ({} <= {:g})\n", t.name, err, expect_path,
                 pass ? "match" : "MISMATCH", atol);
    }
    return ok ? 0 : 1;
  }
  return 0;
}

int run_main(int argc, char** argv, int (*dispatch)(const std::vector<std::string>&)) {
  std::vector<std::string> args(argv + 1, argv + argc);
  try {
    const int status = dispatch(args);
    write_stdout("");  // what was printed reached its destination, or exit 1
    return status;
  } catch (const Error& e) {
    print_error(e);
    return 1;
  } catch (const std::exception& e) {
    std::fflush(stdout);
    fmt::print(stderr, "kiln: internal error: {}\n", e.what());
    return 70;
  }
}

}  // namespace kiln::tools
