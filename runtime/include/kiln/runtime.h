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

/* Element types, the one enumeration of them in the runtime (its plans use it too).
 * KILN_BF16 and KILN_I8 are only a compiled model's bf16 and int8 weights, never an entry
 * point's tensor. */
enum kiln_dtype {
  KILN_F32 = 0,
  KILN_I64 = 1,
  KILN_I32 = 2,
  KILN_BOOL = 3,
  KILN_BF16 = 4,
  KILN_I8 = 5
};

#define KILN_MAX_RANK 8

/* A tensor passed to or returned from an entry point: dense, row-major.
 *
 * Element types: KILN_F32 is float, KILN_I64 int64_t, KILN_I32 int32_t (accepted for
 * i64 inputs, converted), KILN_BOOL one byte per element, 0 or 1. `capacity` is the
 * number of bytes `data` may be read (inputs) or written (outputs) at: every input and
 * output is checked (dtype, rank, shape, capacity, data) before anything is read or
 * written, and a mismatch is refused with an error naming it. */
typedef struct kiln_tensor {
  const char* name; /* parameter or result name; NULL: by position */
  int32_t dtype;    /* enum kiln_dtype */
  int32_t rank;
  int64_t shape[KILN_MAX_RANK];
  void* data;
  size_t capacity; /* bytes at `data` */
} kiln_tensor;

/* Bytes per element of a dtype (KILN_BOOL and KILN_I8: 1, KILN_BF16: 2), or 0 for an
 * unknown one. */
size_t kiln_dtype_size(int32_t dtype);

/* Hooks into the Halide runtime compiled into the model library. release_device (NULL for
 * a CPU library) gives back the GPU context that a library for a GPU target created; the
 * context is one per process, so the runtime calls it when the last GPU model is destroyed. */
typedef void (*kiln_halide_error_handler)(void* user_context, const char* message);
struct halide_buffer_t;
struct halide_device_interface_t;
/* A GPU library's device memory operations: Halide's runtime functions of the same names
 * (HalideRuntime.h) and the library's device interface. With them the runtime keeps the
 * weights, tables and arenas on the device (copied there once) and copies only the entry
 * point's inputs in and outputs back per call. `view_alignment` is the byte alignment a
 * kernel buffer's offset into a device allocation needs (OpenCL sub-buffers:
 * CL_DEVICE_MEM_BASE_ADDR_ALIGN; 1 for CUDA); a view off that alignment goes through a
 * device-to-device copy. `kernel_outputs[k]`: how many of kernel k's buffers (the last) it
 * writes. `allocation` (optional, NULL where the device cannot tell) names the device
 * allocation a buffer lies in: an identity of the allocation (the same for every buffer in
 * it), the byte offset of the buffer's start in it, and the bytes from that start to the
 * allocation's end; it returns 0, or non-zero where it cannot tell for this buffer. The
 * generated OpenCL glue asks clGetMemObjectInfo (CL_MEM_SIZE, and a sub-buffer's parent and
 * offset), the CUDA glue cuMemGetAddressRange. */
typedef struct kiln_device_ops {
  const struct halide_device_interface_t* (*interface)(void);
  int (*device_malloc)(void* user_context, struct halide_buffer_t* buf,
                       const struct halide_device_interface_t* device_interface);
  int (*device_free)(void* user_context, struct halide_buffer_t* buf);
  int (*copy_to_device)(void* user_context, struct halide_buffer_t* buf,
                        const struct halide_device_interface_t* device_interface);
  int (*copy_to_host)(void* user_context, struct halide_buffer_t* buf);
  int (*device_crop)(void* user_context, const struct halide_buffer_t* src,
                     struct halide_buffer_t* dst);
  int (*device_release_crop)(void* user_context, struct halide_buffer_t* buf);
  int (*buffer_copy)(void* user_context, struct halide_buffer_t* src,
                     const struct halide_device_interface_t* dst_device_interface,
                     struct halide_buffer_t* dst);
  int64_t (*view_alignment)(void);
  const int32_t* kernel_outputs;
  int (*allocation)(const struct halide_buffer_t* buf, uint64_t* id, uint64_t* offset,
                    uint64_t* bytes);
} kiln_device_ops;
/* A parallel loop's body and a runner of the loop: Halide's halide_task_t and
 * halide_do_par_for_t (HalideRuntime.h). */
typedef int (*kiln_par_task)(void* user_context, int index, uint8_t* closure);
typedef int (*kiln_do_par_for_fn)(void* user_context, kiln_par_task task, int min, int size,
                                  uint8_t* closure);
/* Halide's halide_malloc_t and halide_free_t (HalideRuntime.h). */
typedef void* (*kiln_malloc_fn)(void* user_context, size_t bytes);
typedef void (*kiln_free_fn)(void* user_context, void* block);
typedef struct kiln_hooks {
  int (*set_num_threads)(int);
  kiln_halide_error_handler (*set_error_handler)(kiln_halide_error_handler);
  /* halide_set_custom_do_par_for: the runtime installs kiln_do_par_for with it. */
  kiln_do_par_for_fn (*set_custom_do_par_for)(kiln_do_par_for_fn);
  void (*release_device)(void);
  const kiln_device_ops* device; /* NULL for a CPU library */
  /* halide_set_custom_malloc and halide_set_custom_free: the runtime installs its allocator
   * of the kernels' scratch memory with them (kiln_kernel_malloc, kiln_kernel_free). */
  kiln_malloc_fn (*set_custom_malloc)(kiln_malloc_fn);
  kiln_free_fn (*set_custom_free)(kiln_free_fn);
} kiln_hooks;

typedef int (*kiln_kernel_fn)(void** args);

/* Used by generated code: builds a model from its serialized plan and kernels, loading
 * and checking weights from `weights_path` (which may be NULL for a model without
 * weights). NULL on failure with the message in *error (free it with kiln_free_error). */
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
/* The input that output `index` of an entry point updates in place (a cache: the caller passes
 * one buffer as both), or -1 for an ordinary output or a bad function or index. */
int kiln_model_output_updates(const kiln_model* model, const char* function, int index);
/* Names of the model's entry points, NULL-terminated list owned by the model. */
const char* const* kiln_model_functions(const kiln_model* model);

/* Fills `outputs[i]`'s name, dtype, rank and shape for the given inputs (data and
 * capacity untouched). Returns 0, or non-zero with kiln_model_error() set. */
int kiln_model_output_shapes(kiln_model* model, const char* function, const kiln_tensor* inputs,
                             size_t num_inputs, kiln_tensor* outputs, size_t num_outputs);
/* Runs an entry point. Inputs by name (or position when name is NULL); ids may be I64 or
 * I32 and are checked against the vocabulary; batch and lengths are checked against the
 * maxima. Outputs must have the dtypes and shapes kiln_model_output_shapes gives and a
 * capacity of at least their bytes. Every input and output is checked before anything is
 * written: on an error no output byte has changed. Returns 0, or non-zero with the
 * message in kiln_model_error().
 *
 * Memory: no byte of an output may be a byte of an input or of another output (the bytes
 * of each tensor's shape count, not its capacity). Kernels write outputs while others still
 * read the inputs, so kiln never runs in place: a call with the same or partly overlapping
 * memory for an input and an output, or for two outputs, is refused before anything is
 * written, with an error naming both tensors and the bytes they share. The one exception is
 * a cache an entry point updates in place (decode_step's), whose output must be the very
 * buffer of its input. Inputs may share memory with each other.
 *
 * Threads: one model may be used from any number of threads at once, and every call
 * computes exactly what it computes alone. The weights are shared read-only; each call
 * that overlaps another gets an arena of its own (the model keeps one per concurrent
 * caller it has seen, for reuse); kiln_model_error is per thread. Only destroying the
 * model must wait for every call on it to end.
 *
 * A library for a GPU target: the weights live on the device, copied there once (by
 * kiln_model_create, or by the next run where the device failed then: a missing driver or
 * device is each run's error); each arena keeps device memory of its own; a call copies
 * its inputs (host memory, as here) to the device once and its outputs back once, and an
 * error leaves the outputs unchanged. */
int kiln_model_run(kiln_model* model, const char* function, const kiln_tensor* inputs,
                   size_t num_inputs, kiln_tensor* outputs, size_t num_outputs);
/* Device-resident tensors (a library compiled for a GPU target): kiln_model_run with
 * tensors that stay on the device, no host copy of them either way. Each kiln_tensor's
 * `data` points to a halide_buffer_t (HalideRuntime.h) with an allocation on the model's
 * device (`device` set, `device_interface` the one kiln_model_device_interface returns,
 * e.g. made with halide_device_malloc), the kiln_tensor's dtype (f32: float, i64: int64,
 * bool: uint8) and its shape dense and row-major (dim[0] the innermost, stride 1);
 * `capacity` is not read. Name, dtype, rank and shape are given as for kiln_model_run and
 * checked the same way, and against the buffer: a host-only buffer, another device
 * interface, a type or shape the buffer does not have, an input whose newest data is on
 * the host (host_dirty set: copy it first, halide_copy_to_device) and i32 ids are refused
 * with an error naming the tensor. So is a shape that needs more bytes than the buffer's
 * allocation holds from the buffer's start (a crop: from its offset), and outputs that
 * share device memory with an input or another output, as kiln_model_run's (the same
 * buffer, or overlapping bytes of one allocation, crops included): the generated OpenCL
 * and CUDA glue tells the runtime each buffer's allocation (kiln_device_ops::allocation).
 * Ids and bools are copied to the host (only those few bytes) to check their values.
 * Outputs are the caller's device buffers of the shapes kiln_model_output_shapes_device
 * gives; the kernels write them on the device, and the call leaves them device_dirty
 * (halide_copy_to_host brings them to the host memory the buffer has, if any). The caller
 * frees them (halide_device_free). A check that fails writes nothing; a device that fails
 * while the kernels run may leave outputs partly written. Entry points that update a cache
 * on the host between kernels (cache_write, as decode_step does) are refused: run them
 * with host tensors. Threads as kiln_model_run. A CPU library returns an error. Returns 0,
 * or non-zero with the message in kiln_model_error(). */
int kiln_model_run_device(kiln_model* model, const char* function, const kiln_tensor* inputs,
                          size_t num_inputs, kiln_tensor* outputs, size_t num_outputs);
/* kiln_model_output_shapes for device-tensor inputs (as kiln_model_run_device takes them). */
int kiln_model_output_shapes_device(kiln_model* model, const char* function,
                                    const kiln_tensor* inputs, size_t num_inputs,
                                    kiln_tensor* outputs, size_t num_outputs);
/* The device interface of a library for a GPU target (halide_opencl_device_interface() or
 * halide_cuda_device_interface() of the Halide runtime in it), to allocate device tensors
 * on; NULL for a CPU library. */
const struct halide_device_interface_t* kiln_model_device_interface(const kiln_model* model);

/* The error of the calling thread's last call on this model ("" if it succeeded; a fixed
 * message for a NULL model). Valid until this thread's next call on the model. */
const char* kiln_model_error(const kiln_model* model);
/* Threads used by the kernels (process-wide: the runtime's one thread pool, and Halide's). */
int kiln_model_set_num_threads(kiln_model* model, int threads);
/* The runtime's thread pool (runtime/thread_pool.h), which every model library's parallel
 * loops run on: its workers spin for KILN_SPIN_US (default 1000) µs after a loop before
 * they sleep, so back-to-back loops find them awake. A loop started while the pool is busy
 * (another thread's call, or a loop in a loop) runs on the calling thread alone. Installed
 * by kiln_model_create; code that calls a library's kernels directly can install it with
 * halide_set_custom_do_par_for. */
int kiln_do_par_for(void* user_context, kiln_par_task task, int min, int size, uint8_t* closure);
/* The kernels' scratch memory (halide_malloc and halide_free of every library's Halide
 * runtime, installed at create): each thread keeps a few blocks it freed and hands them out
 * again, so that a model's calls reuse the same pages (runtime/kernel_memory.h). A program
 * that calls a library's kernels without kiln_model_create may install them with
 * halide_set_custom_malloc and halide_set_custom_free. */
void* kiln_kernel_malloc(void* user_context, size_t bytes);
void kiln_kernel_free(void* user_context, void* block);
/* Profiling: non-zero clears the tallies and times every kernel call of the runs that
 * follow (one clock read per call); zero stops. */
int kiln_model_set_profiling(kiln_model* model, int on);
/* The tallies as text: per entry point its runs and ms per run, then per kernel its
 * calls, total and per-call ms and share of kernel time, slowest first ("" if profiling
 * was never on). Valid until this thread's next call of this function. */
const char* kiln_model_profile(kiln_model* model);

/* Writes the model's weights as the runtime lays them out for its kernels (linear weights
 * transposed or packed, bf16 and int8 converted) to `path`, a file that kiln_model_create then
 * takes in place of the checkpoint and maps (read-only, shared): processes that load one such
 * file share one copy of the weights in memory. `kiln pack-weights` writes it. Refused (at
 * load, naming the file) for another model or weight layout, and when truncated. Returns 0,
 * or non-zero with kiln_model_error() set. */
int kiln_model_save_weights(kiln_model* model, const char* path);

/* The model's config value for `key` (e.g. "max_beam", "bos_id", "tgt_vocab"), or NULL. */
const char* kiln_model_config(const kiln_model* model, const char* key);
/* The declared maximum of a shape symbol (e.g. "B", "T"), or -1 if the model has none. */
int64_t kiln_model_symbol_max(const kiln_model* model, const char* symbol);

/* The declared type of an entry point's input (`output` 0) or output (`output` 1) `index`:
 * its name, dtype and rank, and per dim either its constant extent (extent[d] >= 0, dim[d]
 * NULL) or its size in the model's symbols (extent[d] -1, dim[d] the text the IR writes: "B",
 * "T+1", "2*T"). The strings are the model's, valid while it lives. Returns 0, or -1 for a
 * NULL model, function or out, an unknown function or an index out of range. */
typedef struct kiln_tensor_type {
  const char* name;
  int32_t dtype;
  int32_t rank;
  int64_t extent[KILN_MAX_RANK];
  const char* dim[KILN_MAX_RANK];
} kiln_tensor_type;
int kiln_model_tensor_type(const kiln_model* model, const char* function, int output, int index,
                           kiln_tensor_type* out);

/* Generation: greedy search, beam search and sampling over a model with either protocol:
 * - an encoder–decoder: entry points `prepare` and `decode_step` (frontend/nn.h describes
 *   them); the input is source sentences, generation starts from start_id;
 * - a decoder-only model: entry points `prefill` and `decode_step` (frontend/causal_lm.h,
 *   nn::add_causal_lm; config generation = causal_lm); the input is prompts, generation
 *   continues each prompt, and the result holds the new tokens only.
 * Scores are sums of the generated tokens' log-probabilities (the end token's included when
 * it was generated), divided by length^length_penalty, the length counting the end token.
 * An end token is end_id or any of stop_ids: it ends its hypothesis and is not returned.
 *
 * Search (the reference is tests/golden/make_decode_golden.py): each step, every live beam
 * of a sentence proposes its tokens with score beam + log-probability; in order of score
 * (ties: lower beam, then lower id) an end token finishes its beam's hypothesis, any other
 * token continues it, until beam_size hypotheses continue. A sentence is done once it has
 * beam_size finished hypotheses, or after max_decoding_length tokens (its live beams then
 * finish as they are). beam_size 1 is greedy search. Finished sentences stop costing work.
 *
 * Sampling (sampling_top_k != 1, beam_size 1): each token is drawn from softmax(logits /
 * sampling_temperature) restricted to the sampling_top_k most likely tokens (0: all) and then
 * to the fewest most likely of those whose probabilities (renormalized over them) add up to
 * at least sampling_top_p (nucleus sampling; 1: all), with a generator seeded by `seed`: the
 * same seed and inputs give the same output. */
typedef void (*kiln_token_callback)(void* user_data, int64_t sentence, int64_t step, int64_t token);
typedef struct kiln_search_options {
  /* sizeof(kiln_search_options) in the caller's kiln/runtime.h, set by
   * kiln_search_options_init (always initialize the options with it): kiln_generate refuses
   * options of another size, e.g. from a caller built against an older header. */
  size_t struct_size;
  int32_t beam_size;           /* 1..the model's max_beam; default 1 */
  int32_t num_hypotheses;      /* 1..beam_size: hypotheses returned per sentence; default 1 */
  int32_t max_decoding_length; /* new tokens, the end token included: 1..the model's max_len
                                * (a decoder-only model: max_len - the longest prompt);
                                * 0 (default): as many as fit */
  int32_t min_decoding_length; /* tokens before the end token may be generated; default 0 */
  float length_penalty;        /* default 0: scores are plain sums */
  int64_t start_id, end_id;    /* -1 (default): the model config's bos_id and eos_id;
                                * else a token id (other negative values are refused) */
  int32_t sampling_top_k;      /* 1 (default): no sampling; 0: sample from all tokens */
  float sampling_temperature;  /* default 1 */
  float sampling_top_p;        /* in (0, 1]; default 1: no nucleus cut */
  uint64_t seed;               /* for sampling; default 0 */
  /* More end tokens (e.g. a chat model's end-of-turn ids), besides end_id: num_stop_ids ids
   * at stop_ids (each a token id); default none. */
  const int64_t* stop_ids;
  int32_t num_stop_ids;
  /* With beam_size 1: called for each token as it is chosen (not for the end token), e.g.
   * to stream output; from the calling thread. NULL: none. */
  kiln_token_callback on_token;
  void* user_data;
  /* Vocabulary restriction (an encoder–decoder's; CTranslate2's use_vmap): the target token
   * ids the search may choose, num_vocabulary of them at `vocabulary` (each in [0, the
   * model's tgt_vocab); any order, duplicates allowed; copied, so the array need not outlive
   * the call). The search runs as if every other token's logit were -inf (log-softmax over
   * the set, which always holds end_id and the stop ids so a hypothesis can end), through
   * the model's decode_step_restricted entry point, which computes only the set's logits.
   * NULL or 0 (default): no restriction. A decoder-only model, and a library without
   * decode_step_restricted (compiled by a kiln before it), refuse a restriction. */
  const int64_t* vocabulary;
  int32_t num_vocabulary;
} kiln_search_options;

/* The defaults above, and struct_size: the one definition of each default (kiln translate
 * binds its options to a struct this fills, so its --help shows them). */
void kiln_search_options_init(kiln_search_options* options);

/* What kiln_generate returns; release with kiln_generation_free. kiln_generate zeroes it
 * first, so a refused call leaves a struct that kiln_generation_free accepts. */
typedef struct kiln_generation {
  int64_t batch, hypotheses, max_length;
  int64_t* ids;     /* [batch, hypotheses, max_length], -1 past each hypothesis's length */
  int64_t* lengths; /* [batch, hypotheses]: tokens, without the end token */
  float* scores;    /* [batch, hypotheses], best first */
} kiln_generation;

/* Generates for the source ids `src` [batch, length] (i64 or i32; sentences of different
 * lengths padded with the model's pad_id at the end) or, for a decoder-only model, the
 * prompts `src` [batch, length] (prompts of different lengths padded with -1 at the end;
 * every prompt at least one token). Bad options or input (an id out of
 * range, beam_size 0 or above max_beam, max_decoding_length above max_len, an empty
 * batch, a start_id or end_id below -1, ...) are refused with an error naming them, and the
 * model stays usable. A logit that is NaN or infinite (e.g. from NaN weights) is an error
 * naming the step and the batch row, never a result. Returns 0 and fills *out, or non-zero
 * with the message in kiln_model_error() (*out is zeroed either way, a NULL model
 * included). Thread-safe like kiln_model_run: every call has its own caches (the model keeps
 * a finished call's, up to 512 MiB, for the next call they fit). */
int kiln_generate(kiln_model* model, const kiln_tensor* src, const kiln_search_options* options,
                  kiln_generation* out);
/* Frees what kiln_generate allocated and zeroes *generation: NULL, a zeroed struct and a
 * second call are no-ops. */
void kiln_generation_free(kiln_generation* generation);

/* Continuous batching: a generation that sentences join at step boundaries, instead of
 * waiting for the running batch to finish (a model server's generation requests). The
 * options (on_token and user_data included; stop_ids and vocabulary are copied) hold for every
 * sentence; on_token's `sentence` is the sentence's id. A decoder-only model's sentences join a
 * running batch while they fit: prompts no longer than the batch's time so far (its longest prompt
 * plus the steps run), max_decoding_length within the model's max_len from there, at most
 * max_batch sentences and max_batch x max_beam hypotheses live. An encoder–decoder's
 * decode_step has one position for every row, so its sentences join only once none is
 * running. A generator keeps caches for the model's max_len and max_batch x max_beam
 * hypotheses. One thread at a time per generator; several generators may share a model.
 * NULL for bad options or a NULL model or options (message in kiln_model_error()). */
typedef struct kiln_generator kiln_generator;
kiln_generator* kiln_generator_create(kiln_model* model, const kiln_search_options* options);
/* Adds the sentences `src`, as kiln_generate takes them, each decoding at most
 * max_decoding_length tokens (0: the options' max_decoding_length). Returns 0 with the first
 * one's id in *first_id (the others follow; ids count from 0 over the generator's life); 1
 * when they cannot join now (nothing changed: add them again after a step has finished
 * sentences, or to another generator); -1 for bad input or a failure (kiln_model_error()). */
int kiln_generator_add(kiln_generator* generator, const kiln_tensor* src,
                       int32_t max_decoding_length, int64_t* first_id);
/* Every live hypothesis one token further. Returns the sentences not yet finished (0: none
 * left; more may be added), or -1 with kiln_model_error() set, after which the generator
 * refuses every call but kiln_generator_free. */
int64_t kiln_generator_step(kiln_generator* generator);
/* Ends sentence `id` now (say, its client is gone): its hypotheses leave the batch before the
 * next step, and it is listed as finished, with the hypotheses it had finished (perhaps none).
 * A finished sentence is left as it is. Returns 0, or -1 for an unknown id (kiln_model_error()). */
int kiln_generator_cancel(kiln_generator* generator, int64_t id);
/* Moves up to `capacity` ids of finished sentences (not yet listed) to `ids`; returns how
 * many it moved (0: none finished since). */
int64_t kiln_generator_finished(kiln_generator* generator, int64_t* ids, int64_t capacity);
/* A finished sentence's hypotheses, as kiln_generate gives them for a batch of 1 (free with
 * kiln_generation_free); the generator then forgets the sentence. Returns 0, or -1 (an id
 * unknown or not finished, or taken already) with kiln_model_error() set. */
int kiln_generator_take(kiln_generator* generator, int64_t id, kiln_generation* out);
/* Frees the generator (NULL: a no-op); its unfinished sentences are dropped. */
void kiln_generator_free(kiln_generator* generator);

/* Reads tensor `name` of a safetensors file into `out` (dtype F32 -> KILN_F32; I64 or
 * I32 -> KILN_I64; BOOL or U8 -> KILN_BOOL); out->data is malloc'ed (release with
 * kiln_tensor_free) and out->capacity is its size. Returns 0, or
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

/* A dense tensor owned by the caller: its shape and data. Element types: float (f32),
 * int64_t (i64), int32_t (i32 ids, inputs only) and uint8_t (bool, 0 or 1). */
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

/* The kiln_dtype of a C++ element type. */
template <typename T>
constexpr int32_t dtype_of() {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, int64_t> ||
                    std::is_same_v<T, int32_t> || std::is_same_v<T, uint8_t>,
                "kiln tensors hold float, int64_t, int32_t or uint8_t (bool)");
  if constexpr (std::is_same_v<T, float>) return KILN_F32;
  if constexpr (std::is_same_v<T, int64_t>) return KILN_I64;
  if constexpr (std::is_same_v<T, int32_t>) return KILN_I32;
  return KILN_BOOL;
}

/* The name of a kiln_dtype as kiln's messages spell it. */
inline const char* dtype_name(int32_t dtype) {
  switch (dtype) {
    case KILN_F32:
      return "f32";
    case KILN_I64:
      return "i64";
    case KILN_I32:
      return "i32";
    case KILN_BOOL:
      return "bool";
    case KILN_BF16:
      return "bf16";
    case KILN_I8:
      return "i8";
  }
  return "an unknown dtype";
}

/* A non-owning input view: data, dtype, shape and the bytes the data holds (checked
 * against the shape by the runtime, so a tensor whose shape is larger than its data is
 * refused, never read past its end). */
struct Input {
  const void* data;
  int32_t dtype;
  std::vector<int64_t> shape;
  size_t capacity;
  template <typename T>
  Input(const Tensor<T>& t)
      : data(t.data.data()),
        dtype(dtype_of<T>()),
        shape(t.shape),
        capacity(t.data.size() * sizeof(T)) {}
  Input(const void* d, int32_t type, std::vector<int64_t> s, size_t bytes)
      : data(d), dtype(type), shape(std::move(s)), capacity(bytes) {}
};

/* A non-owning output target: a Tensor<T> that a run reshapes and fills. Its element
 * type must be the result's (checked before anything is written). */
class Output {
 public:
  template <typename T>
  Output(Tensor<T>& t) : Output(&t) {}
  template <typename T>
  Output(Tensor<T>* t)
      : tensor_(t),
        dtype_(dtype_of<T>()),
        prepare_(&prepare<T>),
        fits_(&fit<T>),
        storage_(&store<T>) {}

  int32_t dtype() const { return dtype_; }
  bool null() const { return tensor_ == nullptr; }
  const void* tensor() const { return tensor_; }
  /* Whether binding to `out` (a result's shape) would keep the tensor as it is: its shape
   * is that shape already, and its storage holds exactly that many elements. */
  bool fits(const kiln_tensor& out) const { return fits_(tensor_, out); }
  /* The tensor's storage now: its first byte and its bytes (0 when empty). */
  std::pair<const void*, size_t> storage() const { return storage_(tensor_); }
  /* Reshapes the tensor (reusing its storage) and points `out` at it. */
  void bind(kiln_tensor* out) const { prepare_(tensor_, out); }

 private:
  template <typename T>
  static void prepare(void* tensor, kiln_tensor* out) {
    Tensor<T>& t = *static_cast<Tensor<T>*>(tensor);
    t.shape.assign(out->shape, out->shape + out->rank);
    t.data.resize(static_cast<size_t>(t.numel()));
    out->data = t.data.data();
    out->capacity = t.data.size() * sizeof(T);
  }
  template <typename T>
  static bool fit(const void* tensor, const kiln_tensor& out) {
    const Tensor<T>& t = *static_cast<const Tensor<T>*>(tensor);
    return t.shape == std::vector<int64_t>(out.shape, out.shape + out.rank) &&
           static_cast<int64_t>(t.data.size()) == t.numel();
  }
  template <typename T>
  static std::pair<const void*, size_t> store(const void* tensor) {
    const Tensor<T>& t = *static_cast<const Tensor<T>*>(tensor);
    return {t.data.data(), t.data.size() * sizeof(T)};
  }
  void* tensor_;
  int32_t dtype_;
  void (*prepare_)(void*, kiln_tensor*);
  bool (*fits_)(const void*, const kiln_tensor&);
  std::pair<const void*, size_t> (*storage_)(const void*);
};

/* A device tensor (kiln_model_run_device): a halide_buffer_t on the model's device, the
 * caller's, with its dtype and shape (checked against the buffer). */
struct DeviceTensor {
  halide_buffer_t* buffer = nullptr;
  int32_t dtype = KILN_F32;
  std::vector<int64_t> shape;
};

/* Search options with their defaults (kiln_search_options_init). */
struct SearchOptions : kiln_search_options {
  SearchOptions() { kiln_search_options_init(this); }
};

/* One generated hypothesis: its ids (without start and end tokens) and score. */
struct Hypothesis {
  std::vector<int64_t> ids;
  float score = 0;
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
  /* See kiln_model_save_weights. */
  void save_weights(const std::string& path) {
    check(kiln_model_save_weights(model_.get(), path.c_str()));
  }
  kiln_model* get() const { return model_.get(); }

  /* Runs `function` on `inputs` (in parameter order) into `outputs` (one per output of
   * `function`, in order, each a Tensor of the result's element type): each is reshaped
   * and its storage reused, so repeated calls allocate nothing once every output has held
   * a result at least as large (e.g. one call at the maximum batch and lengths). A wrong
   * count or element type throws before any output is touched, and so does an output that
   * is also an input or another output (`forward(x, x)`; as kiln_model_run, outputs share
   * no memory with inputs or each other, but a cache updated in place: decode_step's
   * caches, passed as input and output, keep their shape and storage). */
  void run(const char* function, const std::vector<Input>& inputs,
           const std::vector<Output>& outputs) {
    std::vector<kiln_tensor> in(inputs.size());
    for (size_t i = 0; i < inputs.size(); ++i) {
      std::memset(&in[i], 0, sizeof in[i]);
      if (inputs[i].shape.size() > KILN_MAX_RANK)
        throw std::runtime_error("kiln: input rank too large");
      in[i].dtype = inputs[i].dtype;
      in[i].rank = static_cast<int32_t>(inputs[i].shape.size());
      for (size_t d = 0; d < inputs[i].shape.size(); ++d) in[i].shape[d] = inputs[i].shape[d];
      in[i].data = const_cast<void*>(inputs[i].data);
      in[i].capacity = inputs[i].capacity;
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
      if (outputs[i].null()) throw std::runtime_error("kiln: output tensor is null");
      if (outputs[i].dtype() != out[i].dtype)
        throw std::runtime_error(std::string("kiln: output '") + out[i].name + "' of '" + function +
                                 "' is " + dtype_name(out[i].dtype) + ", given a " +
                                 dtype_name(outputs[i].dtype()) + " tensor");
    }
    // Before any output is reshaped: reshaping an output that is also an input would free
    // or change the input's memory under the call. An output tensor whose storage is an
    // input's and already has the result's shape is left as it is for the runtime to judge
    // (a cache updated in place; any other overlap it refuses).
    for (size_t i = 0; i < out.size(); ++i) {
      for (size_t j = 0; j < i; ++j)
        if (outputs[j].tensor() == outputs[i].tensor())
          throw std::runtime_error(std::string("kiln: outputs '") + out[j].name + "' and '" +
                                   out[i].name + "' of '" + function +
                                   "' are the same tensor: pass a tensor for each");
      const auto [at, bytes] = outputs[i].storage();
      const uintptr_t first = reinterpret_cast<uintptr_t>(at);
      for (size_t j = 0; j < in.size() && bytes > 0; ++j) {
        const uintptr_t input = reinterpret_cast<uintptr_t>(in[j].data);
        if (!input || input >= first + bytes || first >= input + in[j].capacity) continue;
        if (input == first && outputs[i].fits(out[i])) continue;
        const char* name = kiln_model_input_name(model_.get(), function, static_cast<int>(j));
        throw std::runtime_error(std::string("kiln: output '") + out[i].name + "' of '" + function +
                                 "' shares memory with input '" +
                                 (name ? name : std::to_string(j)) +
                                 "': pass a separate tensor (an output is written while the "
                                 "inputs are read)");
      }
    }
    for (size_t i = 0; i < out.size(); ++i) outputs[i].bind(&out[i]);
    check(kiln_model_run(model_.get(), function, in.data(), in.size(), out.data(), out.size()));
  }

  /* The device interface to allocate device tensors on (kiln_model_device_interface);
   * nullptr for a CPU library. */
  const halide_device_interface_t* device_interface() const {
    return kiln_model_device_interface(model_.get());
  }
  /* The dtypes and shapes of `function`'s outputs for device-tensor `inputs` (buffer left
   * null): what to allocate for run_device. */
  std::vector<DeviceTensor> device_output_shapes(const char* function,
                                                 const std::vector<DeviceTensor>& inputs) {
    std::vector<kiln_tensor> in = device_tensors(inputs);
    int n = kiln_model_num_outputs(model_.get(), function);
    if (n < 0) throw std::runtime_error(std::string("kiln: no entry point '") + function + "'");
    std::vector<kiln_tensor> out(static_cast<size_t>(n));
    check(kiln_model_output_shapes_device(model_.get(), function, in.data(), in.size(), out.data(),
                                          out.size()));
    std::vector<DeviceTensor> shapes(out.size());
    for (size_t i = 0; i < out.size(); ++i) {
      shapes[i].dtype = out[i].dtype;
      shapes[i].shape.assign(out[i].shape, out[i].shape + out[i].rank);
    }
    return shapes;
  }
  /* Runs `function` on device tensors (kiln_model_run_device): `inputs` in parameter order,
   * `outputs` one per output, of the shapes device_output_shapes gives, written on the device
   * (left device_dirty). Throws with the runtime's message, e.g. for a host-only buffer. */
  void run_device(const char* function, const std::vector<DeviceTensor>& inputs,
                  const std::vector<DeviceTensor>& outputs) {
    std::vector<kiln_tensor> in = device_tensors(inputs), out = device_tensors(outputs);
    check(kiln_model_run_device(model_.get(), function, in.data(), in.size(), out.data(),
                                out.size()));
  }

  /* Generation (see kiln_generate): the hypotheses of each source sentence (or, for a
   * decoder-only model, each prompt: its new tokens), best first. */
  std::vector<std::vector<Hypothesis>> generate(const Input& src, const SearchOptions& options) {
    kiln_tensor in;
    std::memset(&in, 0, sizeof in);
    if (src.shape.size() != 2) throw std::runtime_error("kiln: source ids must be [batch, length]");
    in.dtype = src.dtype;
    in.rank = 2;
    in.shape[0] = src.shape[0];
    in.shape[1] = src.shape[1];
    in.data = const_cast<void*>(src.data);
    in.capacity = src.capacity;
    kiln_generation g;
    check(kiln_generate(model_.get(), &in, &options, &g));
    std::vector<std::vector<Hypothesis>> out(static_cast<size_t>(g.batch));
    for (int64_t b = 0; b < g.batch; ++b)
      for (int64_t h = 0; h < g.hypotheses; ++h) {
        const int64_t at = b * g.hypotheses + h;
        const int64_t* ids = g.ids + at * g.max_length;
        out[b].push_back({std::vector<int64_t>(ids, ids + g.lengths[at]), g.scores[at]});
      }
    kiln_generation_free(&g);
    return out;
  }

 protected:
  static std::vector<kiln_tensor> device_tensors(const std::vector<DeviceTensor>& tensors) {
    std::vector<kiln_tensor> out(tensors.size());
    for (size_t i = 0; i < tensors.size(); ++i) {
      std::memset(&out[i], 0, sizeof out[i]);
      if (tensors[i].shape.size() > KILN_MAX_RANK)
        throw std::runtime_error("kiln: device tensor rank too large");
      out[i].dtype = tensors[i].dtype;
      out[i].rank = static_cast<int32_t>(tensors[i].shape.size());
      for (size_t d = 0; d < tensors[i].shape.size(); ++d) out[i].shape[d] = tensors[i].shape[d];
      out[i].data = tensors[i].buffer;
    }
    return out;
  }
  void check(int status) const {
    if (status != 0) throw std::runtime_error(kiln_model_error(model_.get()));
  }
  struct Deleter {
    void operator()(kiln_model* m) const { kiln_model_destroy(m); }
  };
  std::unique_ptr<kiln_model, Deleter> model_;
};

/* Reads a tensor of a safetensors file (F32 as float, I64 and I32 as int64_t, BOOL and U8
 * as uint8_t); another element type than the file's throws. */
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
  if (t.dtype != dtype_of<T>()) {
    const std::string got = dtype_name(t.dtype);
    kiln_tensor_free(&t);
    throw std::runtime_error("kiln: tensor '" + name + "' in '" + path + "' is " + got +
                             ", read as " + dtype_name(dtype_of<T>()));
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
