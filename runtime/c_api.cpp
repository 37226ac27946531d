// The C ABI of kiln/runtime.h: thin extern "C" functions that check their arguments, call
// the runtime's C++ side (model.h, generate.h, safetensors.h) and turn its exceptions into
// the calling thread's error (kiln_model_error) or a malloc'ed message (*error).
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "kiln/runtime.h"
#include "runtime/generate.h"
#include "runtime/kernel_memory.h"
#include "runtime/model.h"
#include "runtime/safetensors.h"
#include "runtime/thread_pool.h"
#include "support/error.h"

using kiln::fail;

namespace {

char* copy_error(const std::string& s) {
  char* out = static_cast<char*>(std::malloc(s.size() + 1));
  if (out) std::memcpy(out, s.c_str(), s.size() + 1);
  return out;
}

}  // namespace

extern "C" {

kiln_model* kiln_model_create(const uint8_t* plan, size_t plan_size, const kiln_kernel_fn* kernels,
                              size_t num_kernels, const kiln_hooks* hooks, const char* weights_path,
                              char** error) {
  try {
    std::unique_ptr<kiln_model> m =
        kiln_model::create(plan, plan_size, kernels, num_kernels, hooks, weights_path);
    if (error) *error = nullptr;
    return m.release();
  } catch (const std::exception& e) {
    if (error) *error = copy_error(e.what());
    return nullptr;
  }
}

void kiln_model_destroy(kiln_model* model) {
  // A GPU library: its device allocations (weights, tables, arenas) are freed, and the
  // context given back once no GPU model is left.
  if (model) model->release();
  delete model;
}
void kiln_free_error(char* error) { std::free(error); }

int kiln_model_num_inputs(const kiln_model* model, const char* function) {
  if (!model || !function) return -1;
  for (const auto& f : model->plan.functions)
    if (f.name == function) return static_cast<int>(f.params.size());
  return -1;
}

int kiln_model_num_outputs(const kiln_model* model, const char* function) {
  if (!model || !function) return -1;
  for (const auto& f : model->plan.functions)
    if (f.name == function) return static_cast<int>(f.results.size());
  return -1;
}

const char* kiln_model_input_name(const kiln_model* model, const char* function, int index) {
  if (!model || !function) return nullptr;
  for (const auto& f : model->plan.functions)
    if (f.name == function && index >= 0 && index < static_cast<int>(f.params.size()))
      return f.params[index].name.c_str();
  return nullptr;
}

int kiln_model_output_updates(const kiln_model* model, const char* function, int index) {
  if (!model || !function) return -1;
  for (const auto& f : model->plan.functions)
    if (f.name == function && index >= 0 && index < static_cast<int>(f.results.size()))
      return f.results[index].updates_param;
  return -1;
}

int kiln_model_tensor_type(const kiln_model* model, const char* function, int output, int index,
                           kiln_tensor_type* out) {
  if (!model || !function || !out) return -1;
  const auto& functions = model->plan.functions;
  for (size_t fi = 0; fi < functions.size(); ++fi) {
    const auto& f = functions[fi];
    if (f.name != function) continue;
    const auto& list = output ? f.results : f.params;
    if (index < 0 || index >= static_cast<int>(list.size())) return -1;
    const kiln::rt::TensorDesc& t = list[static_cast<size_t>(index)];
    const auto& dims =
        model->dim_texts[fi][(output ? f.params.size() : 0) + static_cast<size_t>(index)];
    std::memset(out, 0, sizeof *out);
    out->name = t.name.c_str();
    out->dtype = t.type;
    out->rank = static_cast<int32_t>(t.shape.size());
    for (size_t d = 0; d < t.shape.size() && d < KILN_MAX_RANK; ++d) {
      const bool constant = t.shape[d].is_constant();
      out->extent[d] = constant ? t.shape[d].coeff : -1;
      out->dim[d] = constant ? nullptr : dims[d].c_str();
    }
    return 0;
  }
  return -1;
}

const char* const* kiln_model_functions(const kiln_model* model) {
  static const char* const none[] = {nullptr};
  return model ? model->function_names.data() : none;
}

int kiln_model_output_shapes(kiln_model* model, const char* function, const kiln_tensor* inputs,
                             size_t num_inputs, kiln_tensor* outputs, size_t num_outputs) {
  if (!model) return 1;
  try {
    if (num_outputs && !outputs)
      fail("entry point '{}': outputs is null", function ? function : "");
    model->output_shapes(function, inputs, num_inputs, outputs, num_outputs);
    model->errors.set("");
    return 0;
  } catch (const std::exception& e) {
    model->errors.set(e.what());
    return 1;
  }
}

int kiln_model_run(kiln_model* model, const char* function, const kiln_tensor* inputs,
                   size_t num_inputs, kiln_tensor* outputs, size_t num_outputs) {
  if (!model) return 1;
  try {
    model->run(function, inputs, num_inputs, outputs, num_outputs);
    model->errors.set("");
    return 0;
  } catch (const std::exception& e) {
    model->errors.set(e.what());
    return 1;
  }
}

int kiln_model_output_shapes_device(kiln_model* model, const char* function,
                                    const kiln_tensor* inputs, size_t num_inputs,
                                    kiln_tensor* outputs, size_t num_outputs) {
  if (!model) return 1;
  try {
    if (num_outputs && !outputs)
      fail("entry point '{}': outputs is null", function ? function : "");
    model->output_shapes_device(function, inputs, num_inputs, outputs, num_outputs);
    model->errors.set("");
    return 0;
  } catch (const std::exception& e) {
    model->errors.set(e.what());
    return 1;
  }
}

int kiln_model_run_device(kiln_model* model, const char* function, const kiln_tensor* inputs,
                          size_t num_inputs, kiln_tensor* outputs, size_t num_outputs) {
  if (!model) return 1;
  try {
    model->run(function, inputs, num_inputs, outputs, num_outputs, /*on_device=*/true);
    model->errors.set("");
    return 0;
  } catch (const std::exception& e) {
    model->errors.set(e.what());
    return 1;
  }
}

const struct halide_device_interface_t* kiln_model_device_interface(const kiln_model* model) {
  return model && model->hooks.device ? model->hooks.device->interface() : nullptr;
}

const char* kiln_model_config(const kiln_model* model, const char* key) {
  if (!model || !key) return nullptr;
  for (const auto& [k, v] : model->plan.config)
    if (k == key) return v.c_str();
  return nullptr;
}

int64_t kiln_model_symbol_max(const kiln_model* model, const char* symbol) {
  if (!model || !symbol) return -1;
  for (const auto& s : model->plan.symbols)
    if (s.name == symbol && s.base < 0) return s.max;  // a model's symbol, not T+1
  return -1;
}

int kiln_model_save_weights(kiln_model* model, const char* path) {
  if (!model) return 1;
  try {
    if (!path) fail("no path given for the laid-out weights");
    kiln::rt::write_laid_out_weights(model->plan, model->weights, path);
    model->errors.set("");
    return 0;
  } catch (const std::exception& e) {
    model->errors.set(e.what());
    return 1;
  }
}

void kiln_search_options_init(kiln_search_options* o) {
  if (!o) return;
  std::memset(o, 0, sizeof *o);
  o->struct_size = sizeof *o;
  o->beam_size = 1;
  o->num_hypotheses = 1;
  o->max_decoding_length = 0;  // the model's max_len (runtime/generate.cpp)
  o->min_decoding_length = 0;
  o->length_penalty = 0;
  o->start_id = -1;
  o->end_id = -1;
  o->sampling_top_k = 1;
  o->sampling_temperature = 1;
  o->sampling_top_p = 1;
  o->vocabulary = nullptr;  // no vocabulary restriction
  o->num_vocabulary = 0;
}

namespace {

// A generation in malloc'ed arrays, as kiln_generation_free frees them.
kiln_generation to_c(const kiln::rt::Generation& g) {
  auto copy = [](const auto& v) {
    using T = typename std::decay_t<decltype(v)>::value_type;
    T* p = static_cast<T*>(std::malloc(std::max<size_t>(1, v.size() * sizeof(T))));
    if (!p) fail("out of memory returning a generation");
    if (!v.empty()) std::memcpy(p, v.data(), v.size() * sizeof(T));
    return p;
  };
  kiln_generation r{g.batch, g.hypotheses, g.max_length, nullptr, nullptr, nullptr};
  try {
    r.ids = copy(g.ids);
    r.lengths = copy(g.lengths);
    r.scores = copy(g.scores);
  } catch (...) {
    kiln_generation_free(&r);
    throw;
  }
  return r;
}

void check_struct_size(const char* function, const kiln_search_options& options) {
  if (options.struct_size != sizeof(kiln_search_options))
    fail(
        "{}: options.struct_size is {}, this runtime's kiln_search_options has {} bytes: "
        "initialize the options with kiln_search_options_init (a caller built against another "
        "kiln/runtime.h is refused)",
        function, options.struct_size, sizeof(kiln_search_options));
}

}  // namespace

int kiln_generate(kiln_model* model, const kiln_tensor* src, const kiln_search_options* options,
                  kiln_generation* out) {
  if (out) std::memset(out, 0, sizeof *out);  // a refused call leaves nothing to free
  if (!model) return 1;
  try {
    if (!src || !options || !out) fail("kiln_generate: src, options and out must not be null");
    check_struct_size("kiln_generate", *options);
    *out = to_c(kiln::rt::generate(model, *src, *options));
    model->errors.set("");
    return 0;
  } catch (const std::exception& e) {
    model->errors.set(e.what());
    return 1;
  }
}

void kiln_generation_free(kiln_generation* g) {
  if (!g) return;
  std::free(g->ids);
  std::free(g->lengths);
  std::free(g->scores);
  std::memset(g, 0, sizeof *g);  // a second call frees nothing
}

// ---- kiln_generator_* (runtime/generate.h, Generator) ---------------------------------------

struct kiln_generator {
  kiln_model* model;
  kiln::rt::Generator generator;
  std::vector<int64_t> finished;  // finished, not yet listed by kiln_generator_finished
};

kiln_generator* kiln_generator_create(kiln_model* model, const kiln_search_options* options) {
  if (!model) return nullptr;
  try {
    if (!options) fail("kiln_generator_create: options must not be null");
    check_struct_size("kiln_generator_create", *options);
    auto* g = new kiln_generator{model, kiln::rt::Generator(model, *options), {}};
    model->errors.set("");
    return g;
  } catch (const std::exception& e) {
    model->errors.set(e.what());
    return nullptr;
  }
}

int kiln_generator_add(kiln_generator* g, const kiln_tensor* src, int32_t max_decoding_length,
                       int64_t* first_id) {
  if (!g) return -1;
  try {
    if (!src || !first_id) fail("kiln_generator_add: src and first_id must not be null");
    const std::optional<int64_t> first = g->generator.add(*src, max_decoding_length);
    for (int64_t id : g->generator.take_finished()) g->finished.push_back(id);
    g->model->errors.set("");
    if (!first) return 1;
    *first_id = *first;
    return 0;
  } catch (const std::exception& e) {
    g->model->errors.set(e.what());
    return -1;
  }
}

int64_t kiln_generator_step(kiln_generator* g) {
  if (!g) return -1;
  try {
    g->generator.step();
    for (int64_t id : g->generator.take_finished()) g->finished.push_back(id);
    g->model->errors.set("");
    return g->generator.alive();
  } catch (const std::exception& e) {
    g->model->errors.set(e.what());
    return -1;
  }
}

int kiln_generator_cancel(kiln_generator* g, int64_t id) {
  if (!g) return -1;
  try {
    g->generator.cancel(id);
    for (int64_t done : g->generator.take_finished()) g->finished.push_back(done);
    g->model->errors.set("");
    return 0;
  } catch (const std::exception& e) {
    g->model->errors.set(e.what());
    return -1;
  }
}

int64_t kiln_generator_finished(kiln_generator* g, int64_t* ids, int64_t capacity) {
  if (!g || !ids || capacity < 1) return 0;
  const int64_t n = std::min<int64_t>(capacity, static_cast<int64_t>(g->finished.size()));
  std::copy(g->finished.begin(), g->finished.begin() + n, ids);
  g->finished.erase(g->finished.begin(), g->finished.begin() + n);
  return n;
}

int kiln_generator_take(kiln_generator* g, int64_t id, kiln_generation* out) {
  if (out) std::memset(out, 0, sizeof *out);
  if (!g) return -1;
  try {
    if (!out) fail("kiln_generator_take: out must not be null");
    *out = to_c(g->generator.result(id));
    g->model->errors.set("");
    return 0;
  } catch (const std::exception& e) {
    g->model->errors.set(e.what());
    return -1;
  }
}

void kiln_generator_free(kiln_generator* g) { delete g; }

const char* kiln_model_error(const kiln_model* model) {
  return model ? model->errors.get() : "kiln: no model (NULL)";
}

size_t kiln_dtype_size(int32_t dtype) {
  switch (dtype) {
    case KILN_F32:
      return 4;
    case KILN_I64:
      return 8;
    case KILN_I32:
      return 4;
    case KILN_BOOL:
      return 1;
    case KILN_BF16:
      return 2;
    case KILN_I8:
      return 1;
  }
  return 0;
}

int kiln_do_par_for(void* user_context, kiln_par_task task, int min, int size, uint8_t* closure) {
  return kiln::rt::pool_par_for(user_context, task, min, size, closure);
}

void* kiln_kernel_malloc(void* user_context, size_t bytes) {
  return kiln::rt::kernel_malloc(user_context, bytes);
}

void kiln_kernel_free(void* user_context, void* block) {
  kiln::rt::kernel_free(user_context, block);
}

int kiln_model_set_num_threads(kiln_model* model, int threads) {
  if (!model || !model->hooks.set_num_threads) return -1;
  threads = std::max(threads, 1);
  kiln::rt::pool_set_threads(threads);
  return model->hooks.set_num_threads(threads);
}

int kiln_model_set_profiling(kiln_model* model, int on) {
  if (!model) return -1;
  model->profile.set(on != 0, model->plan.kernel_names.size());
  return 0;
}

const char* kiln_model_profile(kiln_model* model) {
  if (!model) return "";
  thread_local std::string text;  // valid until this thread's next call of this function
  text = model->profile.report(model->plan.kernel_names);
  return text.c_str();
}

int kiln_tensor_read(const char* path, const char* name, kiln_tensor* out, char** error) {
  try {
    if (!path || !name || !out) fail("kiln_tensor_read: null argument");
    kiln::rt::SafeTensors file = kiln::rt::SafeTensors::load(path);
    const kiln::rt::TensorInfo& t = file.at(name);
    if (t.shape.size() > KILN_MAX_RANK) fail("tensor '{}' has rank {}", name, t.shape.size());
    std::memset(out, 0, sizeof *out);
    out->rank = static_cast<int32_t>(t.shape.size());
    for (size_t d = 0; d < t.shape.size(); ++d) out->shape[d] = t.shape[d];
    if (t.dtype == kiln::rt::DType::f32) {
      std::vector<float> v = file.to_f32(t);
      out->dtype = KILN_F32;
      out->data = std::malloc(std::max<size_t>(1, v.size() * 4));
      if (out->data && !v.empty()) std::memcpy(out->data, v.data(), v.size() * 4);
    } else if (t.dtype == kiln::rt::DType::boolean || t.dtype == kiln::rt::DType::u8) {
      std::span<const uint8_t> v = file.bytes(t);
      out->dtype = KILN_BOOL;
      out->data = std::malloc(std::max<size_t>(1, v.size()));
      if (out->data && !v.empty()) std::memcpy(out->data, v.data(), v.size());
    } else {
      std::vector<int64_t> v = file.to_i64(t);
      out->dtype = KILN_I64;
      out->data = std::malloc(std::max<size_t>(1, v.size() * 8));
      if (out->data && !v.empty()) std::memcpy(out->data, v.data(), v.size() * 8);
    }
    if (!out->data) fail("out of memory reading tensor '{}'", name);
    out->capacity = static_cast<size_t>(t.numel()) * kiln_dtype_size(out->dtype);
    if (error) *error = nullptr;
    return 0;
  } catch (const std::exception& e) {
    if (error) *error = copy_error(e.what());
    return 1;
  }
}

void kiln_tensor_free(kiln_tensor* tensor) {
  if (!tensor) return;
  std::free(tensor->data);
  tensor->data = nullptr;
}

}  // extern "C"
