// Running a compiled model's shared library through its C ABI (see compiled.h).
#include "tools/compiled.h"

#include <algorithm>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <span>

#include <fmt/format.h>

#include "kiln/runtime.h"
#include "runtime/library_api.h"
#include "support/error.h"

namespace kiln::tools {
namespace fs = std::filesystem;

// A compiled model's library, opened (runtime/library_api.h), and a model created from it.
struct LoadedLibrary {
  rt::LibraryApi api{};
  std::string name;
  std::unique_ptr<kiln_model, void (*)(kiln_model*)> model{nullptr, nullptr};
};

namespace {

LoadedLibrary open_compiled(const std::string& dir, const std::string& weights_path,
                            const std::string& command) {
  if (weights_path == "-") fail("{} --compiled: weights must be a file, not '-'", command);
  std::error_code ec;
  fs::directory_iterator readable(dir, ec);
  if (ec) fail("{} --compiled: cannot read directory '{}': {}", command, dir, ec.message());
  const rt::Library lib = rt::open_library(dir, command + " --compiled");
  LoadedLibrary l;
  l.api = lib.api;
  l.name = lib.name;
  char* error = nullptr;
  kiln_model* model = l.api.create(weights_path.c_str(), &error);
  if (!model) {
    std::string msg = error ? error : "unknown error";
    l.api.free_error(error);
    fail("{}", msg);
  }
  l.model = std::unique_ptr<kiln_model, void (*)(kiln_model*)>(model, l.api.destroy);
  return l;
}
}  // namespace

void pack_weights(const std::string& dir, const std::string& weights_path,
                  const std::string& output) {
  LoadedLibrary loaded = open_compiled(dir, weights_path, "pack-weights");
  if (!loaded.api.save_weights)
    fail(
        "pack-weights: library '{}' was compiled by a kiln without kiln_model_save_weights: "
        "compile it again",
        loaded.name);
  if (loaded.api.save_weights(loaded.model.get(), output.c_str()) != 0)
    fail("pack-weights: {}", loaded.api.error(loaded.model.get()));
}

std::vector<rt::TensorData> run_compiled(const std::string& dir, const std::string& function,
                                         const std::string& weights_path,
                                         const rt::SafeTensors& inputs,
                                         const CompiledRunOptions& options) {
  if (options.repeat < 1)
    fail("run --compiled: --repeat must be at least 1, got {}", options.repeat);
  LoadedLibrary loaded = open_compiled(dir, weights_path, "run");
  const rt::LibraryApi& api = loaded.api;
  const std::string& name = loaded.name;
  kiln_model* model = loaded.model.get();
  if (options.threads > 0) api.set_num_threads(model, options.threads);
  int n_in = api.num_inputs(model, function.c_str());
  if (n_in < 0) fail("compiled model '{}' has no entry point '{}'", name, function);

  std::vector<kiln_tensor> in(n_in);
  std::vector<std::vector<int64_t>> ids(n_in);
  std::vector<std::vector<float>> floats(n_in);
  std::vector<std::vector<uint8_t>> bools(n_in);
  for (int i = 0; i < n_in; ++i) {
    const char* pname = api.input_name(model, function.c_str(), i);
    const rt::TensorInfo* t = inputs.find(pname);
    if (!t)
      fail("inputs '{}' have no tensor '{}' for entry point '{}'", inputs.label(), pname, function);
    std::memset(&in[i], 0, sizeof in[i]);
    in[i].name = pname;
    if (t->shape.size() > KILN_MAX_RANK) fail("input '{}' has rank {}", pname, t->shape.size());
    in[i].rank = static_cast<int32_t>(t->shape.size());
    for (size_t d = 0; d < t->shape.size(); ++d) in[i].shape[d] = t->shape[d];
    if (t->dtype == rt::DType::f32) {
      floats[i] = inputs.to_f32(*t);
      in[i].dtype = KILN_F32;
      in[i].data = floats[i].data();
      in[i].capacity = floats[i].size() * sizeof(float);
    } else if (t->dtype == rt::DType::boolean || t->dtype == rt::DType::u8) {
      std::span<const uint8_t> bytes = inputs.bytes(*t);
      bools[i].assign(bytes.begin(), bytes.end());
      in[i].dtype = KILN_BOOL;
      in[i].data = bools[i].data();
      in[i].capacity = bools[i].size();
    } else {
      ids[i] = inputs.to_i64(*t);  // I64 or I32; anything else is an error there
      in[i].dtype = KILN_I64;
      in[i].data = ids[i].data();
      in[i].capacity = ids[i].size() * sizeof(int64_t);
    }
  }
  int n_out = api.num_outputs(model, function.c_str());
  std::vector<kiln_tensor> out(n_out);
  if (api.output_shapes(model, function.c_str(), in.data(), in.size(), out.data(), out.size()) != 0)
    fail("{}", api.error(model));
  // Each output into a safetensors tensor of its dtype (bool as BOOL, one byte each).
  std::vector<rt::TensorData> results(n_out);
  for (int r = 0; r < n_out; ++r) {
    const size_t esize = kiln_dtype_size(out[r].dtype);
    if (esize == 0) fail("output '{}' has an unknown dtype {}", out[r].name, out[r].dtype);
    results[r].name = out[r].name;
    results[r].dtype = out[r].dtype == KILN_F32   ? rt::DType::f32
                       : out[r].dtype == KILN_I64 ? rt::DType::i64
                                                  : rt::DType::boolean;
    results[r].shape.assign(out[r].shape, out[r].shape + out[r].rank);
    int64_t n = 1;
    for (int64_t d : results[r].shape) n *= d;
    results[r].data.resize(static_cast<size_t>(n) * esize);
    out[r].data = results[r].data.data();
    out[r].capacity = results[r].data.size();
    // A cache updated in place (decode_step's): its input's buffer serves as the output, and
    // the result is copied from it after the run.
    if (const int p = api.output_updates(model, function.c_str(), r); p >= 0 && p < n_in) {
      out[r].data = in[p].data;
      out[r].capacity = in[p].capacity;
    }
  }
  if (options.profile) api.set_profiling(model, 1);
  for (int i = 0; i < options.repeat; ++i)
    if (api.run(model, function.c_str(), in.data(), in.size(), out.data(), out.size()) != 0)
      fail("{}", api.error(model));
  if (options.profile) fmt::print(stderr, "{}", api.profile(model));
  for (int r = 0; r < n_out; ++r)
    if (out[r].data != results[r].data.data())
      std::memcpy(results[r].data.data(), out[r].data, results[r].data.size());
  return results;
}

}  // namespace kiln::tools

namespace kiln::tools {

CompiledGenerator::CompiledGenerator(const std::string& dir, const std::string& weights_path,
                                     int threads)
    : loaded_(std::make_unique<LoadedLibrary>(open_compiled(dir, weights_path, "translate"))) {
  if (threads > 0) loaded_->api.set_num_threads(loaded_->model.get(), threads);
}

CompiledGenerator::~CompiledGenerator() = default;

int64_t CompiledGenerator::config(const char* key) const {
  const char* v = loaded_->api.config(loaded_->model.get(), key);
  if (!v) return -1;
  int64_t out = 0;
  auto [end, ec] = std::from_chars(v, v + std::strlen(v), out);
  if (ec != std::errc() || *end) fail("model config '{}' is '{}', not an integer", key, v);
  return out;
}

int64_t CompiledGenerator::symbol_max(const char* symbol) const {
  return loaded_->api.symbol_max(loaded_->model.get(), symbol);
}

void CompiledGenerator::set_threads(int threads) const {
  loaded_->api.set_num_threads(loaded_->model.get(), std::max(threads, 1));
}

Generated CompiledGenerator::generate(const std::vector<int64_t>& src, int64_t batch,
                                      int64_t length, const kiln_search_options& search,
                                      const std::function<std::string(int64_t)>& sentence,
                                      const std::function<void(int64_t, int64_t)>& on_token) const {
  kiln_model* model = loaded_->model.get();
  kiln_search_options o = search;
  o.on_token = nullptr;
  struct Stream {
    const std::function<void(int64_t, int64_t)>* fn;
    int64_t first;
  } stream{&on_token, 0};
  if (on_token) {
    o.on_token = [](void* user, int64_t s, int64_t, int64_t token) {
      const Stream* st = static_cast<const Stream*>(user);
      (*st->fn)(st->first + s, token);
    };
    o.user_data = &stream;
  }
  // In chunks of at most the model's max_batch sentences.
  const int64_t chunk = std::max<int64_t>(1, symbol_max("B"));
  Generated out;
  out.batch = batch;
  for (int64_t first = 0; first < std::max<int64_t>(batch, 1); first += chunk) {
    const int64_t n = std::min(chunk, batch - first);
    stream.first = first;
    const kiln_tensor in =
        rt::generation_src(const_cast<int64_t*>(src.data() + first * length), n, length);
    kiln_generation g;
    if (loaded_->api.generate(model, &in, &o, &g) != 0) {
      // "... batch row R ...": row R of this chunk is the input's sentence first + R.
      const std::string message = loaded_->api.error(model);
      const size_t at = message.find("batch row ");
      int64_t row = -1;
      if (at != std::string::npos && sentence) {
        const char* digits = message.c_str() + at + 10;
        std::from_chars(digits, message.c_str() + message.size(), row);
      }
      if (row >= 0 && row < n) fail("{}: {}", sentence(first + row), message);
      fail("{}", message);
    }
    out.hypotheses = g.hypotheses;
    out.max_length = g.max_length;
    const size_t m = static_cast<size_t>(g.batch * g.hypotheses);
    out.ids.insert(out.ids.end(), g.ids, g.ids + m * static_cast<size_t>(g.max_length));
    out.lengths.insert(out.lengths.end(), g.lengths, g.lengths + m);
    out.scores.insert(out.scores.end(), g.scores, g.scores + m);
    loaded_->api.generation_free(&g);
  }
  return out;
}

}  // namespace kiln::tools
