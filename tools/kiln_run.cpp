// kiln-run: runs compiled model libraries (kiln compile --emit=shared) for `kiln run
// --compiled DIR` and `kiln translate`, which hand their command line to it unchanged
// (tools/kiln.cpp, exec_runner). It links kiln's runtime and not the compiler: the GPU
// driver a library loads (pocl, for OpenCL) may bring its own LLVM, which crashes in a
// process that also holds libHalide's LLVM. Output, errors and exit status are kiln's.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "kiln/vocab.h"
#include "support/error.h"
#include "tools/cli.h"
#include "tools/compiled.h"

namespace kiln::tools {
namespace {

// The value of option `name` as an integer >= 1.
int positive_int(const std::string& value, const char* name) {
  int v = 0;
  auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
  if (ec != std::errc() || end != value.data() + value.size() || v < 1)
    fail("run: {} must be a whole number >= 1, got '{}'", name, value);
  return v;
}

// kiln run --compiled DIR (the options of kiln run; see its --help).
int cmd_run(const std::vector<std::string>& argv) {
  Args a = Args::parse(argv, kRunOptions, kRunFlags, "run");
  const std::string weights_path = a.require("--weights", "run");
  const std::string inputs_path = a.require("--inputs", "run");
  const std::string fname = a.get("--function").value_or("forward");
  const std::string dir = a.require("--compiled", "run");
  if (a.positional.size() > 1 || (a.positional.size() == 1 && a.positional[0] != "-"))
    fail("run: with --compiled, FILE is not used (got '{}')", a.positional[0]);
  rt::SafeTensors ifile = load_safetensors(inputs_path);
  CompiledRunOptions options;
  if (auto t = a.get("--threads")) options.threads = positive_int(*t, "--threads");
  if (auto r = a.get("--repeat")) options.repeat = positive_int(*r, "--repeat");
  options.profile = a.flags.count("--profile") > 0;
  return report_outputs(a, run_compiled(dir, fname, weights_path, ifile, options));
}

// The value of option `name` as an integer in [lo, hi].
int64_t int_option(const std::string& value, const char* name, int64_t lo, int64_t hi) {
  int64_t v = 0;
  auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
  if (ec != std::errc() || end != value.data() + value.size() || v < lo || v > hi)
    fail("translate: {} must be a whole number in [{}, {}], got '{}'", name, lo, hi, value);
  return v;
}

double float_option(const std::string& value, const char* name) {
  double v = 0;
  auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
  if (ec != std::errc() || end != value.data() + value.size() || !std::isfinite(v))
    fail("translate: {} must be a number, got '{}'", name, value);
  return v;
}

kiln::Vocabulary load_vocab(const std::string& path) {
  try {
    return kiln::Vocabulary::load(path);
  } catch (const std::runtime_error& e) {
    fail("translate: {}", e.what());
  }
}

// kiln translate (see its --help).
int cmd_translate(const std::vector<std::string>& argv) {
  Args a = Args::parse(
      argv,
      {"--compiled", "--weights", "--inputs", "--src-vocab", "--tgt-vocab", "-o", "--beam",
       "--num-hypotheses", "--max-len", "--min-len", "--length-penalty", "--start-id", "--end-id",
       "--sampling-topk", "--temperature", "--seed", "--threads"},
      {"--scores"}, "translate");
  const std::string dir = a.require("--compiled", "translate");
  const std::string weights = a.require("--weights", "translate");
  GenerateOptions o;
  constexpr int64_t kMaxInt = INT32_MAX;
  if (auto v = a.get("--beam"))
    o.beam_size = static_cast<int32_t>(int_option(*v, "--beam", 0, kMaxInt));
  if (auto v = a.get("--num-hypotheses"))
    o.num_hypotheses = static_cast<int32_t>(int_option(*v, "--num-hypotheses", 0, kMaxInt));
  if (auto v = a.get("--max-len"))
    o.max_decoding_length = static_cast<int32_t>(int_option(*v, "--max-len", 1, kMaxInt));
  if (auto v = a.get("--min-len"))
    o.min_decoding_length = static_cast<int32_t>(int_option(*v, "--min-len", 0, kMaxInt));
  if (auto v = a.get("--length-penalty"))
    o.length_penalty = static_cast<float>(float_option(*v, "--length-penalty"));
  if (auto v = a.get("--start-id")) o.start_id = int_option(*v, "--start-id", 0, INT64_MAX);
  if (auto v = a.get("--end-id")) o.end_id = int_option(*v, "--end-id", 0, INT64_MAX);
  if (auto v = a.get("--sampling-topk"))
    o.sampling_top_k = static_cast<int32_t>(int_option(*v, "--sampling-topk", 0, kMaxInt));
  if (auto v = a.get("--temperature"))
    o.sampling_temperature = static_cast<float>(float_option(*v, "--temperature"));
  if (auto v = a.get("--seed"))
    o.seed = static_cast<uint64_t>(int_option(*v, "--seed", 0, INT64_MAX));
  if (auto v = a.get("--threads"))
    o.threads = static_cast<int>(int_option(*v, "--threads", 1, 1024));

  const bool text = a.get("--src-vocab") || a.get("--tgt-vocab");
  if (text && !(a.get("--src-vocab") && a.get("--tgt-vocab")))
    fail("translate: --src-vocab and --tgt-vocab go together");
  if (text == a.get("--inputs").has_value())
    fail("translate: give either --inputs IN.safetensors or --src-vocab and --tgt-vocab");
  if (!text && !a.positional.empty())
    fail("translate: TEXT arguments need --src-vocab and --tgt-vocab (got '{}')", a.positional[0]);

  std::vector<std::vector<int64_t>> sentences;
  std::vector<std::string> lines;
  std::optional<kiln::Vocabulary> src_vocab, tgt_vocab;
  std::vector<int64_t> src;
  int64_t batch = 0, length = 0;
  if (text) {
    src_vocab = load_vocab(*a.get("--src-vocab"));
    tgt_vocab = load_vocab(*a.get("--tgt-vocab"));
    lines = a.positional;
    if (lines.empty()) {
      std::string line;
      while (std::getline(std::cin, line)) {
        if (!line.empty() && line.back() == '\r') line.pop_back();
        lines.push_back(line);
      }
    }
    const int64_t pad = src_vocab->id("<pad>");
    if (pad < 0) fail("translate: the source vocabulary has no <pad> token");
    for (size_t i = 0; i < lines.size(); ++i) {
      try {
        sentences.push_back(src_vocab->encode(lines[i]));
      } catch (const std::runtime_error& e) {
        fail("translate: sentence {}: {}", i + 1, e.what());
      }
      if (sentences.back().empty()) fail("translate: sentence {} is empty", i + 1);
      length = std::max<int64_t>(length, static_cast<int64_t>(sentences.back().size()));
    }
    batch = static_cast<int64_t>(sentences.size());
    src.assign(static_cast<size_t>(batch * length), pad);
    for (int64_t b = 0; b < batch; ++b)
      std::copy(sentences[b].begin(), sentences[b].end(), src.begin() + b * length);
  } else {
    rt::SafeTensors ifile = load_safetensors(*a.get("--inputs"));
    const rt::TensorInfo* t = ifile.find("src");
    if (!t) fail("translate: inputs '{}' have no tensor 'src'", ifile.label());
    if (t->shape.size() != 2)
      fail("translate: 'src' must be [batch, length], got rank {}", t->shape.size());
    batch = t->shape[0];
    length = t->shape[1];
    src = ifile.to_i64(*t);
  }
  Generated g = generate_compiled(dir, weights, src, batch, length, o);
  if (auto out = a.get("-o")) {
    std::vector<rt::TensorData> data;
    data.push_back(rt::make_i64("ids", {g.batch, g.hypotheses, g.max_length}, g.ids));
    data.push_back(rt::make_i64("lengths", {g.batch, g.hypotheses}, g.lengths));
    data.push_back(rt::make_f32("scores", {g.batch, g.hypotheses}, g.scores));
    rt::write_safetensors(*out, data);
    return 0;
  }
  std::string printed;
  for (int64_t b = 0; b < g.batch; ++b)
    for (int64_t h = 0; h < g.hypotheses; ++h) {
      const int64_t at = b * g.hypotheses + h;
      std::vector<int64_t> ids(g.ids.begin() + at * g.max_length,
                               g.ids.begin() + at * g.max_length + g.lengths[at]);
      if (text) {
        std::string translation;
        try {
          translation = tgt_vocab->decode(ids);
        } catch (const std::runtime_error& e) {
          fail("translate: the model generated {}", e.what());
        }
        printed += fmt::format("{}{} -> {}", h ? "  " : "", h ? "" : lines[b], translation);
        if (a.flags.count("--scores") || g.hypotheses > 1)
          printed += fmt::format("  (score {:.4f})", g.scores[at]);
        printed += "\n";
      } else {
        printed += fmt::format("sentence {} hypothesis {}: score {:.6f} ids [{}]\n", b, h,
                               g.scores[at], fmt::join(ids, ", "));
      }
    }
  write_output("-", printed);
  return 0;
}

int dispatch(const std::vector<std::string>& args) {
  if (!args.empty() && args[0] == "run") return cmd_run({args.begin() + 1, args.end()});
  if (!args.empty() && args[0] == "translate") return cmd_translate({args.begin() + 1, args.end()});
  fail(
      "kiln-run runs compiled models for 'kiln run --compiled DIR' and 'kiln translate'; "
      "use those (see 'kiln run --help')");
}

}  // namespace
}  // namespace kiln::tools

int main(int argc, char** argv) { return kiln::tools::run_main(argc, argv, kiln::tools::dispatch); }
