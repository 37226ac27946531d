/* kiln's runtime API: a plain C ABI that every compiled model library exposes through
 * its generated header, and (for C++) a small header-only wrapper over it.
 *
 * A compiled model is created from a safetensors checkpoint (by state_dict name), runs
 * its entry points (e.g. "forward", "encode") for any batch and length up to the
 * maxima it was compiled for, and reports errors as text (never aborts on bad input).
 */
#ifndef KILN_RUNTIME_H_
#define KILN_RUNTIME_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kiln_model kiln_model;

enum kiln_dtype { KILN_F32 = 0, KILN_I64 = 1, KILN_I32 = 2, KILN_BOOL = 3 };

#define KILN_MAX_RANK 8

/* A tensor passed to or returned from an entry point: dense, row-major. */
typedef struct kiln_tensor {
  const char* name; /* parameter or result name; NULL: by position */
  int32_t dtype;    /* enum kiln_dtype */
  int32_t rank;
  int64_t shape[KILN_MAX_RANK];
  void* data;
} kiln_tensor;

/* Hooks into the Halide runtime compiled into the model library. */
typedef void (*kiln_halide_error_handler)(void* user_context, const char* message);
typedef struct kiln_hooks {
  int (*set_num_threads)(int);
  kiln_halide_error_handler (*set_error_handler)(kiln_halide_error_handler);
} kiln_hooks;

typedef int (*kiln_kernel_fn)(void** args);

/* Used by generated code: builds a model from its serialized plan and kernels, loading
 * and checking weights from `weights_path`. NULL on failure with the message in
 * *error (free it with kiln_free_error). */
kiln_model* kiln_model_create(const uint8_t* plan, size_t plan_size, const kiln_kernel_fn* kernels,
                              size_t num_kernels, const kiln_hooks* hooks, const char* weights_path,
                              char** error);
void kiln_model_destroy(kiln_model* model);
void kiln_free_error(char* error);

/* Number of inputs and outputs of an entry point, or -1 if it does not exist. */
int kiln_model_num_inputs(const kiln_model* model, const char* function);
int kiln_model_num_outputs(const kiln_model* model, const char* function);
/* Name of input `index` of an entry point, or NULL. */
const char* kiln_model_input_name(const kiln_model* model, const char* function, int index);
/* Names of the model's entry points, NULL-terminated list owned by the model. */
const char* const* kiln_model_functions(const kiln_model* model);

/* Fills `outputs[i]`'s name, dtype, rank and shape for the given inputs (data untouched).
 * Returns 0, or non-zero with kiln_model_error() set. */
int kiln_model_output_shapes(kiln_model* model, const char* function, const kiln_tensor* inputs,
                             size_t num_inputs, kiln_tensor* outputs, size_t num_outputs);
/* Runs an entry point. Inputs by name (or position when name is NULL); ids may be I64 or
 * I32 and are checked against the vocabulary; batch and lengths are checked against the
 * maxima. Outputs must have the shapes kiln_model_output_shapes gives and hold data.
 * Returns 0, or non-zero with the message in kiln_model_error(). Not thread-safe for one
 * model (it owns one arena). */
int kiln_model_run(kiln_model* model, const char* function, const kiln_tensor* inputs,
                   size_t num_inputs, kiln_tensor* outputs, size_t num_outputs);
/* The last error of this model ("" if none). */
const char* kiln_model_error(const kiln_model* model);
/* Threads used by the kernels (process-wide). */
int kiln_model_set_num_threads(kiln_model* model, int threads);
/* Profiling: non-zero clears the tallies and times every kernel call of the runs that
 * follow (one clock read per call); zero stops. */
int kiln_model_set_profiling(kiln_model* model, int on);
/* The tallies as text: per entry point its runs and ms per run, then per kernel its
 * calls, total and per-call ms and share of kernel time, slowest first ("" if profiling
 * was never on). Valid until the next call of this function. */
const char* kiln_model_profile(kiln_model* model);

/* Reads tensor `name` of a safetensors file into `out` (dtype F32 -> KILN_F32; I64 or
 * I32 -> KILN_I64); out->data is malloc'ed (release with kiln_tensor_free). Returns 0, or
 * non-zero with the message in *error (free it with kiln_free_error). */
int kiln_tensor_read(const char* path, const char* name, kiln_tensor* out, char** error);
void kiln_tensor_free(kiln_tensor* tensor);

#ifdef __cplusplus
} /* extern "C" */

#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace kiln {

/* A dense tensor owned by the caller: its shape and data. */
template <typename T>
struct Tensor {
  std::vector<int64_t> shape;
  std::vector<T> data;
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
};

/* A non-owning input view. */
struct Input {
  const void* data;
  int32_t dtype;
  std::vector<int64_t> shape;
  Input(const Tensor<int64_t>& t) : data(t.data.data()), dtype(KILN_I64), shape(t.shape) {}
  Input(const Tensor<int32_t>& t) : data(t.data.data()), dtype(KILN_I32), shape(t.shape) {}
  Input(const Tensor<float>& t) : data(t.data.data()), dtype(KILN_F32), shape(t.shape) {}
  Input(const void* d, int32_t type, std::vector<int64_t> s)
      : data(d), dtype(type), shape(std::move(s)) {}
};

/* Owns a kiln_model; the generated model classes derive from it. Errors throw
 * std::runtime_error with the runtime's message. */
class Model {
 public:
  explicit Model(kiln_model* model) : model_(model) {}
  Model(Model&&) = default;
  Model& operator=(Model&&) = default;

  void set_num_threads(int threads) { kiln_model_set_num_threads(model_.get(), threads); }
  /* See kiln_model_set_profiling and kiln_model_profile. */
  void set_profiling(bool on) { kiln_model_set_profiling(model_.get(), on ? 1 : 0); }
  std::string profile() { return kiln_model_profile(model_.get()); }
  kiln_model* get() const { return model_.get(); }

  /* Runs `function` on `inputs` (in parameter order); returns its f32 outputs. */
  std::vector<Tensor<float>> run(const char* function, const std::vector<Input>& inputs) {
    int n = kiln_model_num_outputs(model_.get(), function);
    if (n < 0) throw std::runtime_error(std::string("kiln: no entry point '") + function + "'");
    std::vector<Tensor<float>> result(static_cast<size_t>(n));
    std::vector<Tensor<float>*> outputs;
    for (Tensor<float>& t : result) outputs.push_back(&t);
    run(function, inputs, outputs);
    return result;
  }

  /* As above, into `outputs` (one per output of `function`, in order): each is reshaped
   * and its storage reused, so repeated calls allocate nothing once every output has held
   * a result at least as large (e.g. one call at the maximum batch and lengths). */
  void run(const char* function, const std::vector<Input>& inputs,
           const std::vector<Tensor<float>*>& outputs) {
    std::vector<kiln_tensor> in(inputs.size());
    for (size_t i = 0; i < inputs.size(); ++i) {
      std::memset(&in[i], 0, sizeof in[i]);
      in[i].dtype = inputs[i].dtype;
      in[i].rank = static_cast<int32_t>(inputs[i].shape.size());
      if (inputs[i].shape.size() > KILN_MAX_RANK)
        throw std::runtime_error("kiln: input rank too large");
      for (size_t d = 0; d < inputs[i].shape.size(); ++d) in[i].shape[d] = inputs[i].shape[d];
      in[i].data = const_cast<void*>(inputs[i].data);
    }
    int n = kiln_model_num_outputs(model_.get(), function);
    if (n < 0) throw std::runtime_error(std::string("kiln: no entry point '") + function + "'");
    if (outputs.size() != static_cast<size_t>(n))
      throw std::runtime_error(std::string("kiln: entry point '") + function + "' has " +
                               std::to_string(n) + " output(s), " + std::to_string(outputs.size()) +
                               " given");
    std::vector<kiln_tensor> out(outputs.size());
    check(kiln_model_output_shapes(model_.get(), function, in.data(), in.size(), out.data(),
                                   out.size()));
    for (size_t i = 0; i < out.size(); ++i) {
      if (!outputs[i]) throw std::runtime_error("kiln: output tensor is null");
      outputs[i]->shape.assign(out[i].shape, out[i].shape + out[i].rank);
      outputs[i]->data.resize(static_cast<size_t>(outputs[i]->numel()));
      out[i].data = outputs[i]->data.data();
    }
    check(kiln_model_run(model_.get(), function, in.data(), in.size(), out.data(), out.size()));
  }

 protected:
  void check(int status) const {
    if (status != 0) throw std::runtime_error(kiln_model_error(model_.get()));
  }
  struct Deleter {
    void operator()(kiln_model* m) const { kiln_model_destroy(m); }
  };
  std::unique_ptr<kiln_model, Deleter> model_;
};

/* Reads a tensor of a safetensors file (f32 as float, ids as int64_t). */
template <typename T>
Tensor<T> read_tensor(const std::string& path, const std::string& name) {
  kiln_tensor t;
  char* error = nullptr;
  if (kiln_tensor_read(path.c_str(), name.c_str(), &t, &error) != 0) {
    std::string msg = error ? error : "kiln: cannot read tensor";
    kiln_free_error(error);
    throw std::runtime_error(msg);
  }
  Tensor<T> out;
  out.shape.assign(t.shape, t.shape + t.rank);
  const bool want_float = std::is_floating_point_v<T>;
  if (want_float != (t.dtype == KILN_F32)) {
    kiln_tensor_free(&t);
    throw std::runtime_error("kiln: tensor '" + name + "' in '" + path + "' has another dtype");
  }
  out.data.assign(static_cast<const T*>(t.data), static_cast<const T*>(t.data) + out.numel());
  kiln_tensor_free(&t);
  return out;
}

/* Turns a create call's result into a model or an exception. */
inline kiln_model* checked_model(kiln_model* model, char* error) {
  if (!model) {
    std::string msg = error ? error : "kiln: failed to create the model";
    kiln_free_error(error);
    throw std::runtime_error(msg);
  }
  return model;
}

}  // namespace kiln
#endif /* __cplusplus */

#endif /* KILN_RUNTIME_H_ */
