// kiln serve (see serve.h and README.md, "Serving"): cpp-httplib (Debian's libcpp-httplib) for
// HTTP, nlohmann::json for the bodies, the model's C ABI through runtime/library_api.h. A
// request is parsed and checked on an HTTP thread, queued, and run by a worker, which joins
// compatible /infer requests (same entry point, inputs equal but for dim 0) into one call.
#include "tools/serve.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <deque>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <httplib.h>

#include <nlohmann/json.hpp>

#include "kiln/runtime.h"
#include "kiln/vocab.h"
#include "kiln_version.h"
#include "runtime/batcher.h"
#include "runtime/library_api.h"
#include "support/error.h"
#include "tokenizers/tokenizer.h"
#include "tools/cli.h"

namespace kiln::tools {
namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

struct ServeArgs {
  std::string compiled, weights;       // --compiled, --weights
  std::string host = "127.0.0.1";      // --host
  int port = 8080;                     // --port
  int64_t max_batch = 0;               // --max-batch (0: the model's)
  int64_t max_batch_tokens = 1024;     // --max-batch-tokens (/generate)
  int max_queue_delay_ms = 0;          // --max-queue-delay-ms
  bool no_batching = false;            // --no-batching
  int max_queue = 64;                  // --max-queue
  std::string max_body_bytes = "16M";  // --max-body-bytes
  int request_timeout_ms = 30000;      // --request-timeout-ms
  int workers = 2;                     // --workers
  int http_threads = 16;               // --http-threads
  int threads = 0;                     // --threads
  int shutdown_grace_ms = 500;         // --shutdown-grace-ms
  std::string auth_token;              // --auth-token
  std::string src_vocab, tgt_vocab;    // --src-vocab, --tgt-vocab
};

std::unique_ptr<CLI::App> serve_command(ServeArgs& a) {
  auto app = make_command(
      "serve",
      "--compiled DIR --weights W.safetensors [--host H] [--port N]\n"
      "[--max-batch N] [--max-batch-tokens N] [--max-queue-delay-ms MS] [--no-batching]\n"
      "[--max-queue N] [--max-body-bytes SIZE] [--request-timeout-ms MS] [--workers N]\n"
      "[--http-threads N] [--threads N] [--shutdown-grace-ms MS] [--auth-token TOKEN]\n"
      "[--src-vocab V --tgt-vocab V]",
      "Serves a compiled model (from 'kiln compile --emit=shared') over HTTP with the Open\n"
      "Inference Protocol's REST form (KServe v2): GET /v2/health/live, /v2/health/ready,\n"
      "/v2/models/NAME (metadata), POST /v2/models/NAME/infer (any entry point: \"parameters\":\n"
      "{\"entry_point\": \"encode\"}, default forward), plus POST /v2/models/NAME/generate\n"
      "(ids, or text with --src-vocab and --tgt-vocab; \"stream\": true for server-sent events)\n"
      "and GET /metrics (Prometheus). NAME is the library's (lib<NAME>.so). The first line on\n"
      "standard output is the port listened on (with --port 0, a free one).\n"
      "\n"
      "Concurrent /infer requests of one entry point whose inputs differ only in dim 0 run as\n"
      "one call of at most --max-batch rows, collected for at most --max-queue-delay-ms. At\n"
      "most --max-queue requests wait or run at once: more get 503 with Retry-After. Errors\n"
      "are JSON {\"error\": \"...\"} naming the bad field: 400, 401, 404, 413, 503, 504.\n"
      "SIGTERM or SIGINT: new requests get 503, then every accepted request is answered and\n"
      "kiln serve exits 0.");
  app->add_option("--compiled", a.compiled,
                  "the directory 'kiln compile --emit=shared' wrote (its lib*.so)")
      ->type_name("DIR")
      ->required();
  app->add_option("--weights", a.weights, "weights by state_dict name")
      ->type_name("FILE")
      ->required();
  app->add_option("--host", a.host, "address to listen on (0.0.0.0: every interface)")
      ->type_name("H")
      ->capture_default_str();
  app->add_option("--port", a.port, "port to listen on; 0: a free one (printed)")
      ->type_name("N")
      ->check(whole_number(0, 65535))
      ->capture_default_str();
  app->add_option("--max-batch", a.max_batch,
                  "rows of one batched /infer call; 0: the model's max batch (its batch "
                  "symbol's maximum)")
      ->type_name("N")
      ->check(whole_number(0, INT32_MAX))
      ->capture_default_str();
  app->add_option("--max-batch-tokens", a.max_batch_tokens,
                  "a batch of /generate sentences holds at most N tokens: rows times its "
                  "longest (as kiln translate's)")
      ->type_name("N")
      ->check(whole_number(1, INT64_MAX))
      ->capture_default_str();
  app->add_option("--max-queue-delay-ms", a.max_queue_delay_ms,
                  "how long a batch waits for more requests; 0: it takes those waiting")
      ->type_name("MS")
      ->check(whole_number(0, 60000))
      ->capture_default_str();
  app->add_flag("--no-batching", a.no_batching, "run every /infer request alone");
  app->add_option("--max-queue", a.max_queue,
                  "requests waiting or running at once; more get 503 with Retry-After")
      ->type_name("N")
      ->check(whole_number(1, 1000000))
      ->capture_default_str();
  app->add_option("--max-body-bytes", a.max_body_bytes,
                  "largest request body (K, M, G suffixes); larger get 413")
      ->type_name("SIZE")
      ->check(byte_size())
      ->capture_default_str();
  app->add_option("--request-timeout-ms", a.request_timeout_ms,
                  "a request not answered in this time gets 504")
      ->type_name("MS")
      ->check(whole_number(1, 86400000))
      ->capture_default_str();
  app->add_option("--workers", a.workers, "model calls at once (each a batch)")
      ->type_name("N")
      ->check(whole_number(1, 256))
      ->capture_default_str();
  app->add_option("--http-threads", a.http_threads,
                  "connections served at once (a keep-alive connection holds one)")
      ->type_name("N")
      ->check(whole_number(1, 4096))
      ->capture_default_str();
  app->add_option("--threads", a.threads, "kernel threads (default: the Halide runtime's)")
      ->type_name("N")
      ->check(whole_number(1, 1024));
  app->add_option("--shutdown-grace-ms", a.shutdown_grace_ms,
                  "after SIGTERM, how long new requests still get 503 before the port closes")
      ->type_name("MS")
      ->check(whole_number(0, 600000))
      ->capture_default_str();
  app->add_option("--auth-token", a.auth_token,
                  "require 'Authorization: Bearer TOKEN' (401 without it; not on /v2/health)")
      ->type_name("TOKEN");
  app->add_option("--src-vocab", a.src_vocab, "source vocabulary: /generate takes \"text\"")
      ->type_name("V");
  app->add_option("--tgt-vocab", a.tgt_vocab, "target vocabulary: /generate returns \"text\"")
      ->type_name("V");
  return app;
}

// ---- Errors answered to the client --------------------------------------------------------

struct HttpError {
  int status;
  std::string message;
};

template <typename... Args>
[[noreturn]] void bad(fmt::format_string<Args...> f, Args&&... args) {
  throw HttpError{400, fmt::format(f, std::forward<Args>(args)...)};
}

void reply(httplib::Response& res, int status, const json& body) {
  res.status = status;
  res.set_content(body.dump(), "application/json");
}

void reply_error(httplib::Response& res, int status, const std::string& message) {
  reply(res, status, json{{"error", message}});
}

// ---- The model: entry points and their types ------------------------------------------------

const char* dtype_name(int32_t dtype) {
  switch (dtype) {
    case KILN_F32:
      return "FP32";
    case KILN_I64:
      return "INT64";
    case KILN_BOOL:
      return "BOOL";
    default:
      return "UNKNOWN";
  }
}

struct TensorSpec {
  std::string name;
  int32_t dtype = KILN_F32;
  std::vector<int64_t> extent;   // -1 where symbolic
  std::vector<std::string> dim;  // the symbolic text, or the extent
};

struct EntryPoint {
  std::string name;
  std::vector<TensorSpec> inputs, outputs;
  bool updates = false;      // an output updates an input in place (a cache)
  std::string batch_symbol;  // dim 0 of every input and output, or "" (not batchable)
  int64_t max_batch = 1;     // rows of one batched call
};

struct Model {
  rt::Library lib;
  kiln_model* model = nullptr;
  bool causal = false;  // a decoder-only model (prompts padded with -1), else encoder–decoder
  int64_t pad = -1;     // what /generate pads sentences with
  // Generation requests join a running batch (kiln_generator_*): a decoder-only model, whose
  // positions are per row, from a library that has them.
  bool joins = false;
  std::vector<EntryPoint> entry_points;
  const EntryPoint* find(const std::string& name) const {
    for (const EntryPoint& e : entry_points)
      if (e.name == name) return &e;
    return nullptr;
  }
  std::string names() const {
    std::vector<std::string> n;
    for (const EntryPoint& e : entry_points) n.push_back(e.name);
    return fmt::format("{}", fmt::join(n, ", "));
  }
  int64_t config(const char* key) const {
    const char* v = lib.api.config(model, key);
    if (!v) return -1;
    int64_t out = -1;
    auto [end, ec] = std::from_chars(v, v + std::strlen(v), out);
    return ec == std::errc() && !*end ? out : -1;
  }
};

TensorSpec tensor_spec(const Model& m, const std::string& fn, int output, int index) {
  kiln_tensor_type t;
  if (m.lib.api.tensor_type(m.model, fn.c_str(), output, index, &t) != 0)
    fail("serve: cannot read the type of {} {} of '{}'", output ? "output" : "input", index, fn);
  TensorSpec s;
  s.name = t.name ? t.name : "";
  s.dtype = t.dtype;
  for (int d = 0; d < t.rank; ++d) {
    s.extent.push_back(t.extent[d]);
    s.dim.push_back(t.extent[d] >= 0 ? std::to_string(t.extent[d]) : std::string(t.dim[d]));
  }
  return s;
}

Model open_model(const ServeArgs& a) {
  Model m;
  m.lib = rt::open_library(a.compiled, "serve --compiled");
  char* error = nullptr;
  m.model = m.lib.api.create(a.weights.c_str(), &error);
  if (!m.model) {
    std::string msg = error ? error : "unknown error";
    m.lib.api.free_error(error);
    fail("serve: {}", msg);
  }
  if (a.threads > 0) m.lib.api.set_num_threads(m.model, a.threads);
  m.causal = m.lib.api.symbol_max(m.model, "L") >= 0;
  m.pad = m.causal ? -1 : m.config("pad_id");
  m.joins = m.causal && m.lib.api.generator_create && !a.no_batching;
  for (const char* const* f = m.lib.api.functions(m.model); f && *f; ++f) {
    EntryPoint e;
    e.name = *f;
    const int n_in = m.lib.api.num_inputs(m.model, *f), n_out = m.lib.api.num_outputs(m.model, *f);
    for (int i = 0; i < n_in; ++i) e.inputs.push_back(tensor_spec(m, e.name, 0, i));
    for (int i = 0; i < n_out; ++i) {
      e.outputs.push_back(tensor_spec(m, e.name, 1, i));
      if (m.lib.api.output_updates(m.model, *f, i) >= 0) e.updates = true;
    }
    // Batchable: one symbol is dim 0 of every input and output, and nothing is updated in
    // place.
    std::string sym = !e.inputs.empty() && !e.inputs[0].dim.empty() && e.inputs[0].extent[0] < 0
                          ? e.inputs[0].dim[0]
                          : "";
    for (const auto* list : {&e.inputs, &e.outputs})
      for (const TensorSpec& s : *list)
        if (s.dim.empty() || s.extent[0] >= 0 || s.dim[0] != sym) sym.clear();
    if (!sym.empty() && !e.updates) {
      const int64_t max = m.lib.api.symbol_max(m.model, sym.c_str());
      e.batch_symbol = sym;
      e.max_batch = max > 0 ? max : 1;
      if (a.max_batch > 0) e.max_batch = std::min(e.max_batch, a.max_batch);
      if (a.no_batching) e.max_batch = 1;
    }
    m.entry_points.push_back(std::move(e));
  }
  return m;
}

json spec_json(const TensorSpec& s) {
  json shape = json::array();
  for (int64_t e : s.extent) shape.push_back(e);
  return json{
      {"name", s.name}, {"datatype", dtype_name(s.dtype)}, {"shape", shape}, {"dims", s.dim}};
}

json entry_point_json(const EntryPoint& e) {
  json in = json::array(), out = json::array();
  for (const TensorSpec& s : e.inputs) in.push_back(spec_json(s));
  for (const TensorSpec& s : e.outputs) out.push_back(spec_json(s));
  json j{{"inputs", in}, {"outputs", out}};
  j["max_batch"] = e.batch_symbol.empty() ? 0 : e.max_batch;
  return j;
}

// ---- Tensors of requests and their runs ---------------------------------------------------

struct Tensor {
  std::string name;
  int32_t dtype = KILN_F32;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
  int64_t elements() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
};

struct RunError {
  std::string message;
};

// Runs `ep` on `inputs` (in the entry point's order) through the C ABI.
std::vector<Tensor> run_model(const Model& m, const EntryPoint& ep, std::vector<Tensor>& inputs) {
  const rt::LibraryApi& api = m.lib.api;
  std::vector<kiln_tensor> in(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    std::memset(&in[i], 0, sizeof in[i]);
    in[i].name = inputs[i].name.c_str();
    in[i].dtype = inputs[i].dtype;
    in[i].rank = static_cast<int32_t>(inputs[i].shape.size());
    std::copy(inputs[i].shape.begin(), inputs[i].shape.end(), in[i].shape);
    in[i].data = inputs[i].bytes.data();
    in[i].capacity = inputs[i].bytes.size();
  }
  std::vector<kiln_tensor> out(ep.outputs.size());
  if (api.output_shapes(m.model, ep.name.c_str(), in.data(), in.size(), out.data(), out.size()))
    throw RunError{api.error(m.model)};
  std::vector<Tensor> results(out.size());
  for (size_t r = 0; r < out.size(); ++r) {
    results[r].name = out[r].name;
    results[r].dtype = out[r].dtype;
    results[r].shape.assign(out[r].shape, out[r].shape + out[r].rank);
    results[r].bytes.resize(static_cast<size_t>(results[r].elements()) *
                            kiln_dtype_size(out[r].dtype));
    out[r].data = results[r].bytes.data();
    out[r].capacity = results[r].bytes.size();
    const int p = api.output_updates(m.model, ep.name.c_str(), static_cast<int>(r));
    if (p >= 0 && static_cast<size_t>(p) < in.size()) {  // a cache updated in place
      out[r].data = in[p].data;
      out[r].capacity = in[p].capacity;
    }
  }
  if (api.run(m.model, ep.name.c_str(), in.data(), in.size(), out.data(), out.size()))
    throw RunError{api.error(m.model)};
  for (size_t r = 0; r < out.size(); ++r)
    if (out[r].data != results[r].bytes.data())
      std::memcpy(results[r].bytes.data(), out[r].data, results[r].bytes.size());
  return results;
}

// A value as JSON for an error message, cut after 80 characters.
std::string brief(const json& v) {
  std::string text = v.dump();
  if (text.size() > 80) text = text.substr(0, 77) + "...";
  return text;
}

// Appends the values of `v` (a number, boolean or nested arrays of them) to `t` as its dtype;
// `where` names the field in errors.
void append_values(const json& v, Tensor& t, const std::string& where, int64_t& index,
                   int64_t limit, size_t depth = 0) {
  if (v.is_array()) {
    if (depth == std::max<size_t>(t.shape.size(), 1))
      bad("{}: the lists are nested deeper than the shape's {} dims", where, t.shape.size());
    for (const json& e : v) append_values(e, t, where, index, limit, depth + 1);
    return;
  }
  if (index >= limit)
    bad("{}: shape [{}] holds {} values, got more", where, fmt::join(t.shape, ", "), limit);
  auto at = [&] { return fmt::format("{}[{}]", where, index); };
  if (t.dtype == KILN_F32) {
    if (!v.is_number()) bad("{}: expected a number (FP32), got {}", at(), brief(v));
    const float f = static_cast<float>(v.get<double>());
    const auto* p = reinterpret_cast<const uint8_t*>(&f);
    t.bytes.insert(t.bytes.end(), p, p + sizeof f);
  } else if (t.dtype == KILN_I64) {
    if (!v.is_number_integer()) bad("{}: expected an integer (INT64), got {}", at(), brief(v));
    if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
      bad("{}: {} is out of INT64's range", at(), brief(v));
    const int64_t x = v.get<int64_t>();
    const auto* p = reinterpret_cast<const uint8_t*>(&x);
    t.bytes.insert(t.bytes.end(), p, p + sizeof x);
  } else {
    if (!v.is_boolean()) bad("{}: expected true or false (BOOL), got {}", at(), brief(v));
    t.bytes.push_back(v.get<bool>() ? 1 : 0);
  }
  ++index;
}

const json& field(const json& obj, const char* key, const std::string& where) {
  auto it = obj.find(key);
  if (it == obj.end()) bad("{}missing field '{}'", where.empty() ? "" : where + ": ", key);
  return *it;
}

json parse_body(const std::string& body) {
  try {
    return json::parse(body);
  } catch (const json::parse_error& e) {
    bad("malformed JSON: {}", e.what());
  }
}

// ---- Jobs, the queue and the workers ----------------------------------------------------------

struct GenerateRequest {
  std::vector<std::vector<int64_t>> rows;  // each sentence's ids, unpadded
  std::vector<int64_t> src;                // [batch, length], padded
  int64_t batch = 0, length = 0;
  kiln_search_options search{};
  std::vector<int64_t> stop_ids;
  std::vector<int64_t> vocabulary;  // the target ids the search may choose (empty: all)
  bool stream = false;
};

struct Job {
  enum Kind { kInfer, kGenerate } kind = kInfer;
  // /infer
  const EntryPoint* ep = nullptr;
  std::vector<Tensor> inputs;
  int64_t rows = 0;
  std::string key;       // batching: jobs of one key run as one batch ("": alone)
  int64_t max_rows = 1;  // the rows of such a batch at most
  std::vector<Tensor> outputs;
  // /generate: per sentence, its hypotheses (ids, score), best first
  GenerateRequest gen;
  struct Hypothesis {
    std::vector<int64_t> ids;
    float score = 0;
  };
  std::vector<std::vector<Hypothesis>> hypotheses;
  // Completion (and streamed tokens), under `m`.
  std::mutex m;
  std::condition_variable cv;
  std::deque<int64_t> tokens;
  std::unique_ptr<kiln::tok::StreamDecoder> text;  // streamed text (with a target tokenizer)
  bool done = false;
  std::optional<std::string> error;  // the runtime's message
  std::atomic<bool> cancelled{false};
  void finish() {
    {
      std::lock_guard<std::mutex> l(m);
      done = true;
    }
    cv.notify_all();
  }
};

// Prometheus metrics.
class Metrics {
 public:
  static constexpr double kLatency[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                        0.25,  0.5,    1,     2.5,  5,     10};
  static constexpr int64_t kBatch[] = {1, 2, 4, 8, 16, 32, 64, 128};
  void request(const std::string& endpoint, int status, std::optional<double> seconds) {
    std::lock_guard<std::mutex> l(m_);
    ++requests_[{endpoint, status}];
    if (!seconds) return;
    Hist& h = latency_[endpoint];
    h.count++;
    h.sum += *seconds;
    for (size_t i = 0; i < std::size(kLatency); ++i)
      if (*seconds <= kLatency[i]) h.buckets[i]++;
  }
  void batch(int64_t requests, int64_t rows, const std::string& endpoint = "infer") {
    std::lock_guard<std::mutex> l(m_);
    Batches& b = batches_[endpoint];
    b.count++;
    b.requests += requests;
    b.rows += rows;
    for (size_t i = 0; i < std::size(kBatch); ++i)
      if (requests <= kBatch[i]) b.hist[i]++;
  }
  // Rows (sentences) of a request answered by a running generation, counted before its
  // answer (its batch is counted when the generation ends: batch(requests, 0, "generate")).
  void rows(int64_t rows, const std::string& endpoint) {
    std::lock_guard<std::mutex> l(m_);
    batches_[endpoint].rows += rows;
  }
  // A /generate request that joined a running batch at a step boundary.
  void joined() {
    std::lock_guard<std::mutex> l(m_);
    ++joined_;
  }
  std::string text(int64_t queued, int64_t in_flight) {
    std::lock_guard<std::mutex> l(m_);
    std::string o;
    o += "# HELP kiln_requests_total HTTP requests answered, by endpoint and status.\n";
    o += "# TYPE kiln_requests_total counter\n";
    for (const auto& [k, n] : requests_)
      o += fmt::format("kiln_requests_total{{endpoint=\"{}\",status=\"{}\"}} {}\n", k.first,
                       k.second, n);
    o += "# HELP kiln_request_duration_seconds Time from routing to the answer.\n";
    o += "# TYPE kiln_request_duration_seconds histogram\n";
    for (const auto& [e, h] : latency_) {
      for (size_t i = 0; i < std::size(kLatency); ++i)
        o += fmt::format("kiln_request_duration_seconds_bucket{{endpoint=\"{}\",le=\"{}\"}} {}\n",
                         e, kLatency[i], h.buckets[i]);
      o += fmt::format("kiln_request_duration_seconds_bucket{{endpoint=\"{}\",le=\"+Inf\"}} {}\n",
                       e, h.count);
      o += fmt::format("kiln_request_duration_seconds_sum{{endpoint=\"{}\"}} {}\n", e, h.sum);
      o += fmt::format("kiln_request_duration_seconds_count{{endpoint=\"{}\"}} {}\n", e, h.count);
    }
    o += "# HELP kiln_batch_size Requests per model call of /infer (per batch of /generate).\n";
    o += "# TYPE kiln_batch_size histogram\n";
    for (const auto& [e, b] : batches_) {
      const std::string label = e == "infer" ? "" : fmt::format("{{endpoint=\"{}\"}}", e);
      const std::string le = e == "infer" ? "" : fmt::format("endpoint=\"{}\",", e);
      for (size_t i = 0; i < std::size(kBatch); ++i)
        o += fmt::format("kiln_batch_size_bucket{{{}le=\"{}\"}} {}\n", le, kBatch[i], b.hist[i]);
      o += fmt::format("kiln_batch_size_bucket{{{}le=\"+Inf\"}} {}\n", le, b.count);
      o += fmt::format("kiln_batch_size_sum{} {}\nkiln_batch_size_count{} {}\n", label, b.requests,
                       label, b.count);
    }
    o += "# HELP kiln_batch_rows_total Rows (dim 0) run by /infer calls (sentences: /generate).\n";
    o += "# TYPE kiln_batch_rows_total counter\n";
    for (const auto& [e, b] : batches_)
      o += fmt::format("kiln_batch_rows_total{} {}\n",
                       e == "infer" ? "" : fmt::format("{{endpoint=\"{}\"}}", e), b.rows);
    o += "# HELP kiln_generate_joined_total /generate requests that joined a running batch.\n";
    o += "# TYPE kiln_generate_joined_total counter\n";
    o += fmt::format("kiln_generate_joined_total {}\n", joined_);
    o += "# HELP kiln_queue_depth Requests waiting for a worker.\n";
    o += "# TYPE kiln_queue_depth gauge\n";
    o += fmt::format("kiln_queue_depth {}\n", queued);
    o += "# HELP kiln_requests_in_flight Requests admitted: waiting or running.\n";
    o += "# TYPE kiln_requests_in_flight gauge\n";
    o += fmt::format("kiln_requests_in_flight {}\n", in_flight);
    return o;
  }

 private:
  struct Hist {
    int64_t count = 0;
    double sum = 0;
    int64_t buckets[std::size(kLatency)] = {};
  };
  std::mutex m_;
  std::map<std::pair<std::string, int>, int64_t> requests_;
  std::map<std::string, Hist> latency_;
  struct Batches {
    int64_t count = 0, requests = 0, rows = 0;
    int64_t hist[std::size(kBatch)] = {};
  };
  std::map<std::string, Batches> batches_;
  int64_t joined_ = 0;
};

class Scheduler {
 public:
  Scheduler(const Model& model, Metrics& metrics, int workers, int max_queue, int delay_ms,
            int64_t max_batch_tokens)
      : model_(model),
        metrics_(metrics),
        max_queue_(max_queue),
        delay_(delay_ms),
        max_batch_tokens_(max_batch_tokens) {
    for (int i = 0; i < workers; ++i) workers_.emplace_back([this] { work(); });
  }
  ~Scheduler() { stop(); }
  // Queues `job` unless --max-queue requests are waiting or running. A /generate request of
  // a model whose requests join (Model::joins) goes to the running generation of its search
  // options, if there is one, which adds it at its next step boundary.
  bool admit(const std::shared_ptr<Job>& job) {
    {
      std::lock_guard<std::mutex> l(m_);
      if (in_flight_ >= max_queue_) return false;
      ++in_flight_;
      if (joins(*job))
        if (auto it = sessions_.find(job->key); it != sessions_.end()) {
          it->second->push_back(job);
          return true;
        }
      queue_.push_back(job);
    }
    cv_.notify_all();
    return true;
  }
  int64_t queued() {
    std::lock_guard<std::mutex> l(m_);
    return static_cast<int64_t>(queue_.size());
  }
  int64_t in_flight() {
    std::lock_guard<std::mutex> l(m_);
    return in_flight_;
  }
  // Runs what is queued, then ends the workers.
  void stop() {
    {
      std::lock_guard<std::mutex> l(m_);
      stopping_ = true;
    }
    cv_.notify_all();
    for (std::thread& t : workers_)
      if (t.joinable()) t.join();
  }

 private:
  void done(const std::shared_ptr<Job>& job) {
    job->finish();
    std::lock_guard<std::mutex> l(m_);
    --in_flight_;
  }

  void work() {
    for (;;) {
      std::unique_lock<std::mutex> l(m_);
      cv_.wait(l, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping
      std::vector<std::shared_ptr<Job>> batch{queue_.front()};
      queue_.pop_front();
      const Job& first = *batch[0];
      if (joins(first) && !first.cancelled) {
        // A generation that requests join: this worker runs it until no sentence is left.
        // Requests of its key queued meanwhile go to it too (admit() sends later ones).
        std::deque<std::shared_ptr<Job>> inbox;
        for (auto it = queue_.begin(); it != queue_.end();)
          if ((*it)->key == first.key) {
            inbox.push_back(*it);
            it = queue_.erase(it);
          } else {
            ++it;
          }
        sessions_[first.key] = &inbox;
        l.unlock();
        run_session(batch[0], inbox);
        continue;
      }
      if (!first.key.empty() && first.max_rows > 1 && !first.cancelled) {
        int64_t rows = first.rows;
        const auto deadline = Clock::now() + std::chrono::milliseconds(delay_);
        for (;;) {
          for (auto it = queue_.begin(); it != queue_.end() && rows < first.max_rows;) {
            Job& j = **it;
            if (j.key == first.key && !j.cancelled && rows + j.rows <= first.max_rows) {
              rows += j.rows;
              batch.push_back(*it);
              it = queue_.erase(it);
            } else {
              ++it;
            }
          }
          if (rows >= first.max_rows || stopping_) break;
          if (cv_.wait_until(l, deadline) == std::cv_status::timeout) {
            if (Clock::now() >= deadline) {
              // One last look at what came in with the timeout.
              for (auto it = queue_.begin(); it != queue_.end();) {
                Job& j = **it;
                if (j.key == first.key && !j.cancelled && rows + j.rows <= first.max_rows) {
                  rows += j.rows;
                  batch.push_back(*it);
                  it = queue_.erase(it);
                } else {
                  ++it;
                }
              }
              break;
            }
          }
        }
      }
      l.unlock();
      if (!queue_empty_hint()) cv_.notify_all();  // a waiting job another worker may take
      execute(batch);
      for (const auto& j : batch) done(j);
    }
  }

  bool joins(const Job& j) const {
    return model_.joins && j.kind == Job::kGenerate && !j.key.empty();
  }

  // A generation that the requests of `first`'s key join at step boundaries
  // (kiln_generator_*): each step, the requests in `inbox` (filled by admit() under m_) are
  // added where they fit, and each request is answered as soon as its sentences finish. It
  // ends when no sentence is left and no request waits. If the model fails (a NaN logit,
  // say), every request not answered is run alone, so that only the bad one fails.
  void run_session(std::shared_ptr<Job> first, std::deque<std::shared_ptr<Job>>& inbox) {
    const rt::LibraryApi& api = model_.lib.api;
    struct Member {
      std::shared_ptr<Job> job;
      int64_t first_id = 0, remaining = 0;
    };
    struct Run {
      std::vector<Member> members;
      std::map<int64_t, std::pair<size_t, size_t>> by_id;  // sentence -> (member, row)
      int64_t next_id = 0;  // the generator's next sentence id (it counts them from 0)
    } run;
    kiln_search_options o = first->gen.search;
    o.max_decoding_length = 0;      // each request's own, given as it is added
    point_at_lists(o, first->gen);  // every member's (the key includes them)
    o.on_token = [](void* user, int64_t sentence, int64_t, int64_t token) {
      Run& r = *static_cast<Run*>(user);
      const auto it = r.by_id.find(sentence);
      if (it == r.by_id.end()) return;
      Job& job = *r.members[it->second.first].job;
      if (!job.gen.stream) return;
      {
        std::lock_guard<std::mutex> l(job.m);
        job.tokens.push_back(token);
      }
      job.cv.notify_all();
    };
    o.user_data = &run;
    kiln_generator* g = api.generator_create(model_.model, &o);
    std::vector<std::shared_ptr<Job>> pending{first};  // to add
    int64_t alive = 0, answered = 0;
    bool failed = g == nullptr;
    // Adds `j`; false when it cannot join now.
    auto add = [&](const std::shared_ptr<Job>& j) {
      if (j->cancelled) {
        done(j);
        return true;
      }
      const kiln_tensor in = rt::generation_src(j->gen.src.data(), j->gen.batch, j->gen.length);
      // by_id first: tokens chosen while it is added (its first) are streamed.
      const size_t member = run.members.size();
      int64_t id = run.next_id;
      run.members.push_back({j, id, j->gen.batch});
      for (int64_t r = 0; r < j->gen.batch; ++r) run.by_id[id + r] = {member, size_t(r)};
      j->hypotheses.assign(static_cast<size_t>(j->gen.batch), {});
      const int rc = api.generator_add(g, &in, j->gen.search.max_decoding_length, &id);
      if (rc != 0) {
        for (int64_t r = 0; r < j->gen.batch; ++r) run.by_id.erase(run.members.back().first_id + r);
        run.members.pop_back();
        if (rc == 1) return false;
        failed = true;  // bad input, or the model failed: see below
        pending.push_back(j);
        return true;
      }
      if (alive > 0) metrics_.joined();
      alive += j->gen.batch;
      run.next_id += j->gen.batch;
      return true;
    };
    auto collect = [&] {
      int64_t ids[64];
      for (int64_t n; (n = api.generator_finished(g, ids, 64)) > 0;)
        for (int64_t k = 0; k < n; ++k) {
          const auto it = run.by_id.find(ids[k]);
          if (it == run.by_id.end()) continue;  // not ours: cannot happen
          const auto [member, row] = it->second;
          run.by_id.erase(it);
          Member& m = run.members[member];
          kiln_generation r;
          if (api.generator_take(g, ids[k], &r) == 0)
            for (int64_t h = 0; h < r.hypotheses; ++h) {
              const int64_t* t = r.ids + h * r.max_length;
              m.job->hypotheses[row].push_back({{t, t + r.lengths[h]}, r.scores[h]});
            }
          api.generation_free(&r);
          --alive;
          if (--m.remaining == 0) {
            if (!m.job->cancelled) {
              ++answered;
              metrics_.rows(m.job->gen.batch, "generate");
            }
            done(m.job);
          }
        }
    };
    while (!failed) {
      {
        std::lock_guard<std::mutex> l(m_);
        while (!inbox.empty()) {
          pending.push_back(inbox.front());
          inbox.pop_front();
        }
      }
      // Requests their clients gave up (504, a closed stream) leave the batch.
      for (const Member& m : run.members)
        if (m.remaining > 0 && m.job->cancelled)
          for (int64_t r = 0; r < m.job->gen.batch; ++r) api.generator_cancel(g, m.first_id + r);
      std::vector<std::shared_ptr<Job>> waiting;
      for (auto& j : std::exchange(pending, {}))
        if (failed || !add(j)) waiting.push_back(j);
      if (failed) {
        pending.insert(pending.end(), waiting.begin(), waiting.end());
        break;
      }
      pending = std::move(waiting);
      collect();
      if (alive == 0) {
        {
          std::lock_guard<std::mutex> l(m_);
          if (pending.empty() && inbox.empty()) {
            sessions_.erase(first->key);
            break;
          }
        }
        // A batch ended and requests wait: they start the next one, in a fresh generator, so
        // that a generation under steady load holds nothing of its finished requests.
        api.generator_free(g);
        run.members.clear();
        run.by_id.clear();
        run.next_id = 0;
        g = api.generator_create(model_.model, &o);
        if (!g) {
          failed = true;
          break;
        }
        continue;
      }
      if (api.generator_step(g) < 0) {
        failed = true;
        break;
      }
      collect();
    }
    if (failed) {
      {
        std::lock_guard<std::mutex> l(m_);
        sessions_.erase(first->key);
        pending.insert(pending.end(), inbox.begin(), inbox.end());
      }
      for (const Member& m : run.members)
        if (m.remaining > 0) pending.push_back(m.job);
      for (const auto& j : pending) {
        generate_alone(*j);
        done(j);
      }
    }
    if (g) api.generator_free(g);
    if (answered > 0) metrics_.batch(answered, 0, "generate");
  }

  bool queue_empty_hint() {
    std::lock_guard<std::mutex> l(m_);
    return queue_.empty();
  }

  void execute(std::vector<std::shared_ptr<Job>>& batch) {
    std::vector<std::shared_ptr<Job>> live;
    for (const auto& j : batch)
      if (!j->cancelled) live.push_back(j);
    if (live.empty()) return;
    if (live[0]->kind == Job::kGenerate) return generate_batched(live);
    int64_t rows = 0;
    for (const auto& j : live) rows += j->rows;
    metrics_.batch(static_cast<int64_t>(live.size()), rows);
    if (live.size() == 1) return run_one(*live[0]);
    // Concatenate along dim 0, run once, split the outputs back.
    const EntryPoint& ep = *live[0]->ep;
    std::vector<Tensor> inputs = live[0]->inputs;
    for (size_t i = 0; i < inputs.size(); ++i) {
      inputs[i].shape[0] = rows;
      for (size_t k = 1; k < live.size(); ++k)
        inputs[i].bytes.insert(inputs[i].bytes.end(), live[k]->inputs[i].bytes.begin(),
                               live[k]->inputs[i].bytes.end());
    }
    std::vector<Tensor> outputs;
    try {
      outputs = run_model(model_, ep, inputs);
    } catch (const RunError&) {
      // One bad request (an id out of range, say) must not fail the others: each alone.
      for (const auto& j : live) run_one(*j);
      return;
    }
    int64_t at = 0;
    for (const auto& j : live) {
      j->outputs.resize(outputs.size());
      for (size_t r = 0; r < outputs.size(); ++r) {
        const Tensor& o = outputs[r];
        const size_t row_bytes = o.bytes.size() / static_cast<size_t>(rows);
        Tensor& t = j->outputs[r];
        t.name = o.name;
        t.dtype = o.dtype;
        t.shape = o.shape;
        t.shape[0] = j->rows;
        t.bytes.assign(o.bytes.begin() + static_cast<ptrdiff_t>(at * row_bytes),
                       o.bytes.begin() + static_cast<ptrdiff_t>((at + j->rows) * row_bytes));
      }
      at += j->rows;
    }
  }

  // The search options' lists, from the request's (which outlive the search).
  static void point_at_lists(kiln_search_options& o, const GenerateRequest& g) {
    o.stop_ids = g.stop_ids.data();
    o.num_stop_ids = static_cast<int32_t>(g.stop_ids.size());
    o.vocabulary = g.vocabulary.empty() ? nullptr : g.vocabulary.data();
    o.num_vocabulary = static_cast<int32_t>(g.vocabulary.size());
  }

  void run_one(Job& j) {
    try {
      j.outputs = run_model(model_, *j.ep, j.inputs);
    } catch (const RunError& e) {
      j.error = e.message;
    }
  }

  // kiln_generate on `src` [n, length] with `search`: per sentence its hypotheses, or the
  // runtime's error. With `stream`, each token is handed to that job as it is chosen.
  std::optional<std::string> run_generate(std::vector<int64_t>& src, int64_t n, int64_t length,
                                          const GenerateRequest& g, Job* stream,
                                          std::vector<std::vector<Job::Hypothesis>>& out) {
    const rt::LibraryApi& api = model_.lib.api;
    kiln_search_options o = g.search;
    point_at_lists(o, g);
    if (stream) {
      o.on_token = [](void* user, int64_t, int64_t, int64_t token) {
        Job* job = static_cast<Job*>(user);
        {
          std::lock_guard<std::mutex> l(job->m);
          job->tokens.push_back(token);
        }
        job->cv.notify_all();
      };
      o.user_data = stream;
    }
    const kiln_tensor in = rt::generation_src(src.data(), n, length);
    kiln_generation r;
    if (api.generate(model_.model, &in, &o, &r) != 0) {
      api.generation_free(&r);
      return std::string(api.error(model_.model));
    }
    out.assign(static_cast<size_t>(r.batch), {});
    for (int64_t b = 0; b < r.batch; ++b)
      for (int64_t h = 0; h < r.hypotheses; ++h) {
        const int64_t at = b * r.hypotheses + h;
        const int64_t* ids = r.ids + at * r.max_length;
        out[static_cast<size_t>(b)].push_back({{ids, ids + r.lengths[at]}, r.scores[at]});
      }
    api.generation_free(&r);
    return std::nullopt;
  }

  void generate_alone(Job& j) {
    metrics_.batch(1, j.gen.batch, "generate");
    j.error = run_generate(j.gen.src, j.gen.batch, j.gen.length, j.gen, j.gen.stream ? &j : nullptr,
                           j.hypotheses);
  }

  // Jobs of one search (their key): their sentences grouped by length (runtime/batcher.h:
  // at most --max-batch-tokens tokens and the model's max batch rows a batch), each batch one
  // kiln_generate; a batch that fails is run job by job, so that only the bad job fails.
  void generate_batched(std::vector<std::shared_ptr<Job>>& jobs) {
    if (jobs.size() == 1) return generate_alone(*jobs[0]);
    struct Sentence {
      Job* job;
      size_t row;
    };
    std::vector<Sentence> sentences;
    std::vector<int64_t> lengths;
    for (const auto& j : jobs) {
      j->hypotheses.assign(j->gen.rows.size(), {});
      for (size_t r = 0; r < j->gen.rows.size(); ++r) {
        sentences.push_back({j.get(), r});
        lengths.push_back(static_cast<int64_t>(j->gen.rows[r].size()));
      }
    }
    const rt::BatchLimits limits{max_batch_tokens_, jobs[0]->max_rows, 0};
    for (const rt::Batch& b : rt::group_by_length(lengths, limits)) {
      const int64_t n = static_cast<int64_t>(b.requests.size());
      const int64_t length = std::max<int64_t>(b.length, 1);
      std::vector<int64_t> src(static_cast<size_t>(n * length), model_.pad);
      for (int64_t i = 0; i < n; ++i) {
        const Sentence& st = sentences[b.requests[static_cast<size_t>(i)]];
        const std::vector<int64_t>& ids = st.job->gen.rows[st.row];
        std::copy(ids.begin(), ids.end(), src.begin() + i * length);
      }
      std::vector<std::vector<Job::Hypothesis>> out;
      if (run_generate(src, n, length, jobs[0]->gen, nullptr, out)) {
        for (const auto& j : jobs) generate_alone(*j);  // only the bad job fails
        return;
      }
      for (int64_t i = 0; i < n; ++i) {
        const Sentence& st = sentences[b.requests[static_cast<size_t>(i)]];
        st.job->hypotheses[st.row] = std::move(out[static_cast<size_t>(i)]);
      }
    }
    metrics_.batch(static_cast<int64_t>(jobs.size()), static_cast<int64_t>(sentences.size()),
                   "generate");
  }

  const Model& model_;
  Metrics& metrics_;
  const int64_t max_queue_;
  const int delay_;
  const int64_t max_batch_tokens_;
  std::mutex m_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Job>> queue_;
  // The running generations that requests join, by key: each one's inbox.
  std::map<std::string, std::deque<std::shared_ptr<Job>>*> sessions_;
  int64_t in_flight_ = 0;
  bool stopping_ = false;
  std::vector<std::thread> workers_;
};

// ---- Whole replies -----------------------------------------------------------------------------
//
// Behind a proxy, a reply must reach it whole or not at all. nginx retries a request on another
// server only while it holds no byte of the answer (proxy_next_upstream), and cpp-httplib 0.11
// writes a reply's header and its body in two send()s: a server SIGKILLed between them would
// leave nginx a header without its body, an answer cut short that it can no longer retry.
// So while a reply is written its connection is corked (TCP_CORK: the header waits in the
// kernel for the body) and set to reset on close (SO_LINGER 0: if the process dies now, the
// kernel drops what it holds and resets the connection, so nginx has no answer and retries).
// Once the body is written (the logger runs just after), the linger is restored and then the
// cork removed: a process killed between the two still has its whole reply sent by the kernel.
// A reply longer than a segment (64 KiB on loopback) leaves in full segments while the body is
// written, so only up to that size is a reply whole-or-nothing. Streamed replies (server-sent
// events) are not held: each event must leave as it is written.
//
// cpp-httplib 0.11 does not hand a handler its socket. Every connection is served whole by one
// thread of CountingPool, so the socket is found once per connection, on that thread, among
// the process's descriptors by the request's two addresses.

thread_local int t_connection = -1;  // this thread's connection's socket, once found (-1: not)

bool same_address(const sockaddr_storage& sa, const std::string& ip, int port) {
  char text[INET6_ADDRSTRLEN] = {};
  if (sa.ss_family == AF_INET) {
    const auto& in = reinterpret_cast<const sockaddr_in&>(sa);
    inet_ntop(AF_INET, &in.sin_addr, text, sizeof text);
    return ntohs(in.sin_port) == port && ip == text;
  }
  if (sa.ss_family == AF_INET6) {
    const auto& in = reinterpret_cast<const sockaddr_in6&>(sa);
    inet_ntop(AF_INET6, &in.sin6_addr, text, sizeof text);
    return ntohs(in.sin6_port) == port && ip == text;
  }
  return false;
}

bool is_connection(int fd, const httplib::Request& req) {
  sockaddr_storage local{}, peer{};
  socklen_t n1 = sizeof local, n2 = sizeof peer;
  return getsockname(fd, reinterpret_cast<sockaddr*>(&local), &n1) == 0 &&
         getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &n2) == 0 &&
         same_address(local, req.local_addr, req.local_port) &&
         same_address(peer, req.remote_addr, req.remote_port);
}

int connection_of(const httplib::Request& req) {
  if (t_connection >= 0 && is_connection(t_connection, req)) return t_connection;
  t_connection = -1;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd", ec)) {
    int fd = -1;
    const std::string name = entry.path().filename().string();
    auto [end, err] = std::from_chars(name.data(), name.data() + name.size(), fd);
    if (err == std::errc() && end == name.data() + name.size() && is_connection(fd, req))
      return t_connection = fd;
  }
  return -1;
}

void hold_reply(int fd, bool hold) {
  if (fd < 0) return;
  const int cork = hold ? 1 : 0;
  const linger abort_on_close{hold ? 1 : 0, 0};
  if (hold) {
    setsockopt(fd, IPPROTO_TCP, TCP_CORK, &cork, sizeof cork);
    setsockopt(fd, SOL_SOCKET, SO_LINGER, &abort_on_close, sizeof abort_on_close);
  } else {  // this order: see above
    setsockopt(fd, SOL_SOCKET, SO_LINGER, &abort_on_close, sizeof abort_on_close);
    setsockopt(fd, IPPROTO_TCP, TCP_CORK, &cork, sizeof cork);
  }
}

// httplib's connection pool, counting the connections accepted and not yet closed (the drain
// waits for them).
class CountingPool : public httplib::TaskQueue {
 public:
  CountingPool(size_t n, std::atomic<int64_t>& open, std::atomic<int64_t>& last_accept)
      : pool_(n), open_(open), last_accept_(last_accept) {}
  void enqueue(std::function<void()> fn) override {
    ++open_;
    last_accept_ = Clock::now().time_since_epoch().count();
    pool_.enqueue([this, fn = std::move(fn)] {
      t_connection = -1;  // fn serves one connection, on this thread
      fn();
      t_connection = -1;
      --open_;
    });
  }
  void shutdown() override { pool_.shutdown(); }

 private:
  httplib::ThreadPool pool_;
  std::atomic<int64_t>& open_;
  std::atomic<int64_t>& last_accept_;  // Clock ticks
};

// ---- The server ------------------------------------------------------------------------------

class Server {
 public:
  Server(const ServeArgs& a, const Model& model)
      : a_(a),
        model_(model),
        scheduler_(model, metrics_, a.workers, a.max_queue, a.max_queue_delay_ms,
                   a.max_batch_tokens),
        timeout_(a.request_timeout_ms) {
    if (!a.src_vocab.empty()) {
      src_vocab_ = load_vocab(a.src_vocab, "source");
      tgt_vocab_ = load_vocab(a.tgt_vocab, "target");
      try {
        src_vocab_->check_model("source", model.config("src_vocab"), model.config("pad_id"),
                                model.config("bos_id"), model.config("eos_id"));
        tgt_vocab_->check_model("target", model.config("tgt_vocab"), model.config("pad_id"),
                                model.config("bos_id"), model.config("eos_id"));
      } catch (const std::runtime_error& e) {
        fail("serve: {}", e.what());
      }
    }
    causal_ = model.lib.api.symbol_max(model.model, "L") >= 0;
    generates_ = model.find("decode_step") && (model.find("prepare") || model.find("prefill"));
  }

  int run() {
    httplib::Server svr;
    svr.new_task_queue = [this] {
      return new CountingPool(static_cast<size_t>(a_.http_threads), open_connections_,
                              last_accept_);
    };
    svr.set_payload_max_length(static_cast<size_t>(*parse_byte_size(a_.max_body_bytes)));
    svr.set_tcp_nodelay(true);  // else a reply's body waits for the ACK of its headers (40 ms)
    svr.set_keep_alive_max_count(1000);
    svr.set_keep_alive_timeout(2);
    svr.set_read_timeout(10);
    svr.set_write_timeout(10);
    routes(svr);
    // cpp-httplib 0.11 listens with a backlog of 5: in a burst of new connections the SYNs
    // beyond it are dropped, and their clients wait a second to send them again. So the
    // listening socket (which set_socket_options is given, before it binds) listens again
    // with the system's maximum: Linux takes a second listen() as a new backlog.
    int listener = -1;
    svr.set_socket_options([&listener](int sock) {
      int yes = 1;  // what cpp-httplib's default options set
      setsockopt(sock, SOL_SOCKET, SO_REUSEPORT, &yes, sizeof yes);
      listener = sock;
    });
    int port = a_.port;
    if (port == 0) {
      port = svr.bind_to_any_port(a_.host);
      if (port < 0) fail("serve: cannot listen on {} (a free port)", a_.host);
    } else if (!svr.bind_to_port(a_.host, port)) {
      fail("serve: cannot listen on {}:{}: {}", a_.host, port, std::strerror(errno));
    }
    if (listener >= 0 && ::listen(listener, SOMAXCONN) != 0)
      fail("serve: cannot listen on {}:{}: {}", a_.host, port, std::strerror(errno));
    fmt::print("{}\n", port);
    std::fflush(stdout);
    fmt::print(stderr, "kiln serve: '{}' on http://{}:{} (entry points: {})\n", model_.lib.name,
               a_.host, port, model_.names());
    // SIGTERM and SIGINT are taken by a thread of their own (blocked in every other thread).
    std::thread signals([this, &svr] {
      sigset_t set;
      sigemptyset(&set);
      sigaddset(&set, SIGTERM);
      sigaddset(&set, SIGINT);
      int sig = 0;
      sigwait(&set, &sig);
      drain(svr, sig);
    });
    signals.detach();
    const bool ok = svr.listen_after_bind();
    scheduler_.stop();
    if (!ok && !draining_) fail("serve: the server stopped: {}", std::strerror(errno));
    fmt::print(stderr, "kiln serve: drained, exiting\n");
    return 0;
  }

 private:
  static std::unique_ptr<kiln::tok::Tokenizer> load_vocab(const std::string& path,
                                                          const char* role) {
    try {
      return kiln::tok::load_tokenizer(path);
    } catch (const kiln::Error& e) {
      fail("serve: {} vocabulary: {}", role, e.what());
    }
  }

  void drain(httplib::Server& svr, int sig) {
    fmt::print(stderr, "kiln serve: {}: new requests get 503; draining\n",
               sig == SIGTERM ? "SIGTERM" : "SIGINT");
    draining_ = true;
    std::this_thread::sleep_for(std::chrono::milliseconds(a_.shutdown_grace_ms));
    // Every accepted connection answered (each reply now closes its connection; an idle
    // keep-alive connection ends within the keep-alive timeout), every queued request run,
    // and no connection for 100 ms (a client slow to see its 503 may still be coming).
    const auto quiet = [&] {
      return Clock::now().time_since_epoch().count() - last_accept_ >
             std::chrono::duration_cast<Clock::duration>(std::chrono::milliseconds(100)).count();
    };
    while (open_connections_ > 0 || scheduler_.in_flight() > 0 || !quiet())
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    svr.stop();
  }

  static std::string endpoint_of(const std::string& path) {
    if (path == "/v2/health/live") return "health_live";
    if (path == "/v2/health/ready") return "health_ready";
    if (path == "/metrics") return "metrics";
    if (path == "/v2") return "server_metadata";
    if (path.rfind("/v2/models/", 0) == 0) {
      const std::string rest = path.substr(11);
      const size_t slash = rest.find('/');
      if (slash == std::string::npos) return "model_metadata";
      const std::string tail = rest.substr(slash + 1);
      if (tail == "infer" || tail == "generate" || tail == "ready") return tail;
    }
    return "other";
  }

  void check_model_name(const std::string& name) const {
    if (name != model_.lib.name)
      throw HttpError{
          404, fmt::format("unknown model '{}' (this server serves '{}')", name, model_.lib.name)};
  }

  void routes(httplib::Server& svr) {
    using httplib::Request;
    using httplib::Response;
    static thread_local Clock::time_point started;
    static thread_local bool routed = false;
    svr.set_pre_routing_handler([this](const Request& req, Response& res) {
      started = Clock::now();
      routed = true;
      const bool health = req.path.rfind("/v2/health/", 0) == 0;
      if (!a_.auth_token.empty() && !health &&
          req.get_header_value("Authorization") != "Bearer " + a_.auth_token) {
        res.set_header("WWW-Authenticate", "Bearer");
        reply_error(res, 401,
                    req.has_header("Authorization")
                        ? "the bearer token is wrong"
                        : "missing 'Authorization: Bearer TOKEN' (kiln serve --auth-token)");
        return httplib::Server::HandlerResponse::Handled;
      }
      const std::string ep = endpoint_of(req.path);
      if (draining_ && (ep == "infer" || ep == "generate")) {
        res.set_header("Retry-After", "1");
        reply_error(res, 503, "the server is shutting down (SIGTERM); retry on another");
        return httplib::Server::HandlerResponse::Handled;
      }
      return httplib::Server::HandlerResponse::Unhandled;
    });
    static thread_local int held = -1;  // the connection whose reply is held (Whole replies)
    svr.set_post_routing_handler([this](const Request& req, Response& res) {
      if (draining_) res.set_header("Connection", "close");
      if (res.get_header_value("Content-Type") != "text/event-stream")
        hold_reply(held = connection_of(req), true);
    });
    svr.set_logger([this](const Request& req, const Response& res) {
      hold_reply(held, false);
      held = -1;
      std::optional<double> seconds;
      if (routed) seconds = std::chrono::duration<double>(Clock::now() - started).count();
      routed = false;
      metrics_.request(endpoint_of(req.path), res.status, seconds);
    });
    svr.set_error_handler(
        httplib::Server::HandlerWithResponse([this](const Request& req, Response& res) {
          if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
          if (res.status == 413)
            reply_error(res, 413,
                        fmt::format("the request body is larger than {} bytes (--max-body-bytes)",
                                    *parse_byte_size(a_.max_body_bytes)));
          else if (res.status == 404)
            reply_error(res, 404, fmt::format("no such path: {} {}", req.method, req.path));
          else
            reply_error(res, res.status, fmt::format("HTTP status {}", res.status));
          return httplib::Server::HandlerResponse::Handled;
        }));
    svr.set_exception_handler([](const Request&, Response& res, std::exception_ptr ep) {
      std::string what = "unknown exception";
      try {
        std::rethrow_exception(ep);
      } catch (const std::exception& e) {
        what = e.what();
      } catch (...) {
      }
      reply_error(res, 500, "internal error: " + what);
    });
    auto guarded = [](auto fn) {
      return [fn](const Request& req, Response& res) {
        try {
          fn(req, res);
        } catch (const HttpError& e) {
          reply_error(res, e.status, e.message);
        } catch (const json::exception& e) {
          reply_error(res, 400, std::string("bad request: ") + e.what());
        }
      };
    };
    svr.Get("/v2/health/live", [](const Request&, Response& res) {
      reply(res, 200, json{{"live", true}});
    });
    svr.Get("/v2/health/ready", [this](const Request&, Response& res) {
      reply(res, draining_ ? 503 : 200, json{{"ready", !draining_}});
    });
    svr.Get("/v2", [this](const Request&, Response& res) {
      reply(res, 200,
            json{{"name", "kiln"}, {"version", KILN_VERSION}, {"extensions", {"generate"}}});
    });
    svr.Get("/metrics", [this](const Request&, Response& res) {
      res.set_content(metrics_.text(scheduler_.queued(), scheduler_.in_flight()),
                      "text/plain; version=0.0.4");
    });
    svr.Get(R"(/v2/models/([^/]+))", guarded([this](const Request& req, Response& res) {
              check_model_name(req.matches[1]);
              reply(res, 200, metadata());
            }));
    svr.Get(
        R"(/v2/models/([^/]+)/ready)", guarded([this](const Request& req, Response& res) {
          check_model_name(req.matches[1]);
          reply(res, draining_ ? 503 : 200, json{{"name", model_.lib.name}, {"ready", !draining_}});
        }));
    svr.Post(R"(/v2/models/([^/]+)/infer)", guarded([this](const Request& req, Response& res) {
               check_model_name(req.matches[1]);
               infer(req, res);
             }));
    svr.Post(R"(/v2/models/([^/]+)/generate)", guarded([this](const Request& req, Response& res) {
               check_model_name(req.matches[1]);
               generate(req, res);
             }));
  }

  json metadata() const {
    json eps = json::object();
    for (const EntryPoint& e : model_.entry_points) eps[e.name] = entry_point_json(e);
    const EntryPoint* def = model_.find("forward");
    if (!def && !model_.entry_points.empty()) def = &model_.entry_points[0];
    json j{{"name", model_.lib.name}, {"versions", json::array()}, {"platform", "kiln"}};
    if (def) {
      json e = entry_point_json(*def);
      j["inputs"] = e["inputs"];
      j["outputs"] = e["outputs"];
      j["default_entry_point"] = def->name;
    }
    j["entry_points"] = eps;
    j["generate"] = generates_;
    return j;
  }

  // Admits `job` and waits for it: 503 when the queue is full, 504 after the time limit.
  void submit(const std::shared_ptr<Job>& job, httplib::Response& res) {
    if (!scheduler_.admit(job)) {
      res.set_header("Retry-After", "1");
      throw HttpError{503, fmt::format("the request queue is full ({} requests waiting or "
                                       "running, --max-queue); retry later",
                                       a_.max_queue)};
    }
    std::unique_lock<std::mutex> l(job->m);
    if (!job->cv.wait_for(l, timeout_, [&] { return job->done; })) {
      job->cancelled = true;
      throw HttpError{504, fmt::format("the request took longer than {} ms (--request-timeout-ms)",
                                       a_.request_timeout_ms)};
    }
  }

  void infer(const httplib::Request& req, httplib::Response& res) {
    const json j = parse_body(req.body);
    if (!j.is_object()) bad("the request body must be a JSON object, got {}", j.type_name());
    std::string fn = model_.find("forward") ? "forward" : model_.entry_points.at(0).name;
    if (auto p = j.find("parameters"); p != j.end()) {
      if (!p->is_object()) bad("parameters: expected an object, got {}", p->type_name());
      if (auto e = p->find("entry_point"); e != p->end()) {
        if (!e->is_string()) bad("parameters.entry_point: expected a string, got {}", brief(*e));
        fn = e->get<std::string>();
        if (!model_.find(fn))
          bad("parameters.entry_point: model '{}' has no entry point '{}' (its entry points: {})",
              model_.lib.name, fn, model_.names());
      }
    }
    const EntryPoint& ep = *model_.find(fn);
    auto job = std::make_shared<Job>();
    job->ep = &ep;
    job->inputs.resize(ep.inputs.size());
    std::vector<bool> given(ep.inputs.size(), false);
    const json& inputs = field(j, "inputs", "");
    if (!inputs.is_array()) bad("inputs: expected an array, got {}", inputs.type_name());
    for (size_t k = 0; k < inputs.size(); ++k) {
      const std::string where = fmt::format("inputs[{}]", k);
      const json& in = inputs[k];
      if (!in.is_object()) bad("{}: expected an object, got {}", where, in.type_name());
      const json& name = field(in, "name", where);
      if (!name.is_string()) bad("{}.name: expected a string, got {}", where, brief(name));
      size_t i = 0;
      while (i < ep.inputs.size() && ep.inputs[i].name != name.get<std::string>()) ++i;
      if (i == ep.inputs.size()) {
        std::vector<std::string> names;
        for (const TensorSpec& s : ep.inputs) names.push_back(s.name);
        bad("{}.name: entry point '{}' has no input '{}' (its inputs: {})", where, fn,
            name.get<std::string>(), fmt::join(names, ", "));
      }
      if (given[i]) bad("{}.name: input '{}' is given twice", where, ep.inputs[i].name);
      given[i] = true;
      const TensorSpec& spec = ep.inputs[i];
      const json& dt = field(in, "datatype", where);
      if (!dt.is_string()) bad("{}.datatype: expected a string, got {}", where, brief(dt));
      if (dt.get<std::string>() != dtype_name(spec.dtype))
        bad("{}.datatype: input '{}' of '{}' is {}, got '{}'", where, spec.name, fn,
            dtype_name(spec.dtype), dt.get<std::string>());
      const json& shape = field(in, "shape", where);
      if (!shape.is_array()) bad("{}.shape: expected an array, got {}", where, shape.type_name());
      Tensor& t = job->inputs[i];
      t.name = spec.name;
      t.dtype = spec.dtype;
      int64_t count = 1;
      for (const json& d : shape) {
        if (!d.is_number_integer() || d.get<int64_t>() < 0)
          bad("{}.shape: expected non-negative integers, got {}", where, brief(shape));
        t.shape.push_back(d.get<int64_t>());
        if (d.get<int64_t>() > (int64_t{1} << 40) ||
            (count *= d.get<int64_t>()) > (int64_t{1} << 40))
          bad("{}.shape: {} is too large", where, brief(shape));
      }
      if (t.shape.size() != spec.extent.size())
        bad("{}.shape: input '{}' of '{}' has rank {} ([{}]), got {}", where, spec.name, fn,
            spec.extent.size(), fmt::join(spec.dim, ", "), brief(shape));
      for (size_t d = 0; d < spec.extent.size(); ++d)
        if (spec.extent[d] >= 0 && t.shape[d] != spec.extent[d])
          bad("{}.shape: dim {} of input '{}' of '{}' is {} ([{}]), got {}", where, d, spec.name,
              fn, spec.extent[d], fmt::join(spec.dim, ", "), brief(shape));
      const json& data = field(in, "data", where);
      if (!data.is_array()) bad("{}.data: expected an array, got {}", where, data.type_name());
      t.bytes.reserve(static_cast<size_t>(count) * kiln_dtype_size(t.dtype));
      int64_t index = 0;
      append_values(data, t, where + ".data", index, count);
      if (index != count)
        bad("{}.data: shape {} holds {} values, got {}", where, brief(shape), count, index);
    }
    for (size_t i = 0; i < ep.inputs.size(); ++i)
      if (!given[i]) bad("inputs: entry point '{}' needs input '{}'", fn, ep.inputs[i].name);
    std::vector<std::string> wanted;
    if (auto o = j.find("outputs"); o != j.end()) {
      if (!o->is_array()) bad("outputs: expected an array, got {}", o->type_name());
      for (size_t k = 0; k < o->size(); ++k) {
        const json& out = (*o)[k];
        const std::string where = fmt::format("outputs[{}]", k);
        if (!out.is_object()) bad("{}: expected an object, got {}", where, out.type_name());
        const json& name = field(out, "name", where);
        if (!name.is_string()) bad("{}.name: expected a string, got {}", where, brief(name));
        if (std::none_of(ep.outputs.begin(), ep.outputs.end(),
                         [&](const TensorSpec& s) { return s.name == name.get<std::string>(); }))
          bad("{}.name: entry point '{}' has no output '{}'", where, fn, name.get<std::string>());
        wanted.push_back(name.get<std::string>());
      }
    }
    std::string id;
    if (auto i = j.find("id"); i != j.end()) {
      if (!i->is_string()) bad("id: expected a string, got {}", brief(*i));
      id = i->get<std::string>();
    }
    // Batching key: every input's dim 0 equal (the rows), the rest of the shapes equal.
    if (!ep.batch_symbol.empty() && ep.max_batch > 1) {
      job->rows = job->inputs[0].shape[0];
      job->max_rows = ep.max_batch;
      job->key = "infer " + fn;
      for (const Tensor& t : job->inputs) {
        if (t.shape[0] != job->rows || job->rows == 0) {
          job->key.clear();
          break;
        }
        job->key += fmt::format("|{}", fmt::join(t.shape.begin() + 1, t.shape.end(), ","));
      }
    }
    submit(job, res);
    if (job->error) bad("{}", *job->error);
    json outs = json::array();
    for (const Tensor& t : job->outputs) {
      if (!wanted.empty() && std::find(wanted.begin(), wanted.end(), t.name) == wanted.end())
        continue;
      json data = json::array();
      const int64_t n = t.elements();
      auto& arr = data.get_ref<json::array_t&>();
      arr.reserve(static_cast<size_t>(n));
      for (int64_t e = 0; e < n; ++e) {
        if (t.dtype == KILN_F32) {
          float f;
          std::memcpy(&f, t.bytes.data() + e * 4, 4);
          arr.emplace_back(static_cast<double>(f));
        } else if (t.dtype == KILN_I64) {
          int64_t x;
          std::memcpy(&x, t.bytes.data() + e * 8, 8);
          arr.emplace_back(x);
        } else {
          arr.emplace_back(t.bytes[static_cast<size_t>(e)] != 0);
        }
      }
      outs.push_back(json{{"name", t.name},
                          {"datatype", dtype_name(t.dtype)},
                          {"shape", t.shape},
                          {"data", std::move(data)}});
    }
    json body{{"model_name", model_.lib.name}, {"outputs", std::move(outs)}};
    if (!id.empty()) body["id"] = id;
    body["entry_point"] = fn;
    reply(res, 200, body);
  }

  // The body's integer `key` into `out` (within [lo, hi]).
  template <typename T>
  static void read_int(const json& j, const char* key, T& out, int64_t lo, int64_t hi) {
    auto it = j.find(key);
    if (it == j.end()) return;
    if (!it->is_number_integer() || it->get<int64_t>() < lo || it->get<int64_t>() > hi)
      bad("{}: expected an integer in [{}, {}], got {}", key, lo, hi, brief(*it));
    out = static_cast<T>(it->get<int64_t>());
  }
  static void read_float(const json& j, const char* key, float& out) {
    auto it = j.find(key);
    if (it == j.end()) return;
    if (!it->is_number()) bad("{}: expected a number, got {}", key, brief(*it));
    out = static_cast<float>(it->get<double>());
  }

  void generate(const httplib::Request& req, httplib::Response& res) {
    if (!generates_)
      bad("model '{}' does not generate (it has no decode_step with prepare or prefill)",
          model_.lib.name);
    const json j = parse_body(req.body);
    if (!j.is_object()) bad("the request body must be a JSON object, got {}", j.type_name());
    static const char* kFields[] = {"id",
                                    "ids",
                                    "text",
                                    "stream",
                                    "beam_size",
                                    "num_hypotheses",
                                    "max_decoding_length",
                                    "min_decoding_length",
                                    "length_penalty",
                                    "start_id",
                                    "end_id",
                                    "sampling_top_k",
                                    "sampling_temperature",
                                    "sampling_top_p",
                                    "seed",
                                    "stop_ids",
                                    "vocabulary"};
    for (const auto& [k, v] : j.items())
      if (std::find(std::begin(kFields), std::end(kFields), k) == std::end(kFields))
        bad("unknown field '{}' (fields: {})", k, fmt::join(kFields, ", "));
    auto job = std::make_shared<Job>();
    job->kind = Job::kGenerate;
    GenerateRequest& g = job->gen;
    model_.lib.api.search_options_init(&g.search);
    read_int(j, "beam_size", g.search.beam_size, 1, INT32_MAX);
    read_int(j, "num_hypotheses", g.search.num_hypotheses, 1, INT32_MAX);
    read_int(j, "max_decoding_length", g.search.max_decoding_length, 0, INT32_MAX);
    read_int(j, "min_decoding_length", g.search.min_decoding_length, 0, INT32_MAX);
    read_float(j, "length_penalty", g.search.length_penalty);
    read_int(j, "start_id", g.search.start_id, -1, INT64_MAX);
    read_int(j, "end_id", g.search.end_id, -1, INT64_MAX);
    read_int(j, "sampling_top_k", g.search.sampling_top_k, 0, INT32_MAX);
    read_float(j, "sampling_temperature", g.search.sampling_temperature);
    read_float(j, "sampling_top_p", g.search.sampling_top_p);
    if (auto s = j.find("seed"); s != j.end()) {
      if (!s->is_number_unsigned()) bad("seed: expected a non-negative integer, got {}", brief(*s));
      g.search.seed = s->get<uint64_t>();
    }
    if (auto s = j.find("stop_ids"); s != j.end()) {
      if (!s->is_array()) bad("stop_ids: expected an array of token ids, got {}", brief(*s));
      for (const json& v : *s) {
        if (!v.is_number_integer() || v.get<int64_t>() < 0)
          bad("stop_ids: expected token ids, got {}", brief(v));
        g.stop_ids.push_back(v.get<int64_t>());
      }
    }
    if (auto s = j.find("vocabulary"); s != j.end()) {
      // CTranslate2's vocabulary restriction (docs/generation.md): encoder–decoders only.
      if (causal_)
        bad("vocabulary: restricting the vocabulary needs an encoder–decoder model; '{}' is "
            "decoder-only",
            model_.lib.name);
      if (!s->is_array() || s->empty())
        bad("vocabulary: expected a non-empty array of target token ids, got {}", brief(*s));
      const int64_t tgt = model_.config("tgt_vocab");
      if (s->size() > static_cast<size_t>(INT32_MAX))
        bad("vocabulary: {} ids, at most {}", s->size(), INT32_MAX);
      for (size_t i = 0; i < s->size(); ++i) {
        const json& v = (*s)[i];
        if (!v.is_number_integer()) bad("vocabulary[{}]: expected a token id, got {}", i, brief(v));
        const int64_t id = v.get<int64_t>();
        if (id < 0 || (tgt > 0 && id >= tgt))
          bad("vocabulary[{}]: token id {} is out of range [0, {}) (the model's tgt_vocab)", i, id,
              tgt);
        g.vocabulary.push_back(id);
      }
    }
    if (auto s = j.find("stream"); s != j.end()) {
      if (!s->is_boolean()) bad("stream: expected true or false, got {}", brief(*s));
      g.stream = s->get<bool>();
    }
    const bool has_ids = j.contains("ids"), has_text = j.contains("text");
    if (has_ids == has_text) bad("give either 'ids' or 'text'");
    std::vector<std::vector<int64_t>> rows;
    std::vector<std::string> texts;
    const int64_t vocab = model_.config(causal_ ? "vocab" : "src_vocab");
    const int64_t max_len = model_.lib.api.symbol_max(model_.model, causal_ ? "L" : "S");
    if (has_ids) {
      const json& ids = j["ids"];
      if (!ids.is_array() || ids.empty())
        bad("ids: expected a non-empty array of token id lists, got {}", brief(ids));
      for (size_t r = 0; r < ids.size(); ++r) {
        if (!ids[r].is_array() || ids[r].empty())
          bad("ids[{}]: expected a non-empty array of token ids, got {}", r, brief(ids[r]));
        std::vector<int64_t> row;
        for (size_t c = 0; c < ids[r].size(); ++c) {
          const json& v = ids[r][c];
          if (!v.is_number_integer())
            bad("ids[{}][{}]: expected a token id, got {}", r, c, brief(v));
          const int64_t id = v.get<int64_t>();
          if (id < 0 || (vocab > 0 && id >= vocab))
            bad("ids[{}][{}]: token id {} is out of range [0, {}) (the model's {})", r, c, id,
                vocab, causal_ ? "vocab" : "src_vocab");
          row.push_back(id);
        }
        rows.push_back(std::move(row));
      }
    } else {
      if (!src_vocab_ || !tgt_vocab_)
        bad("text: kiln serve was started without --src-vocab and --tgt-vocab; send 'ids'");
      const json& text = j["text"];
      std::vector<json> items;
      if (text.is_string())
        items.push_back(text);
      else if (text.is_array() && !text.empty())
        items.assign(text.begin(), text.end());
      else
        bad("text: expected a string or a non-empty array of strings, got {}", brief(text));
      for (size_t r = 0; r < items.size(); ++r) {
        if (!items[r].is_string()) bad("text[{}]: expected a string, got {}", r, brief(items[r]));
        texts.push_back(items[r].get<std::string>());
        try {
          rows.push_back(src_vocab_->encode(texts.back()));
        } catch (const std::runtime_error& e) {
          bad("text[{}]: {}", r, e.what());
        }
        if (rows.back().empty()) bad("text[{}]: the sentence is empty", r);
      }
    }
    for (size_t r = 0; r < rows.size(); ++r)
      if (max_len > 0 && static_cast<int64_t>(rows[r].size()) > max_len)
        bad("{}[{}]: {} tokens, the model reads at most {}", has_ids ? "ids" : "text", r,
            rows[r].size(), max_len);
    const int64_t max_batch = model_.lib.api.symbol_max(model_.model, "B");
    if (max_batch > 0 && static_cast<int64_t>(rows.size()) > max_batch)
      bad("{}: {} sentences, the model's max batch is {}", has_ids ? "ids" : "text", rows.size(),
          max_batch);
    if (g.stream && (rows.size() != 1 || g.search.beam_size != 1))
      bad("stream: streaming needs one sentence and beam_size 1");
    g.batch = static_cast<int64_t>(rows.size());
    for (const auto& r : rows)
      g.length = std::max<int64_t>(g.length, static_cast<int64_t>(r.size()));
    g.src.assign(static_cast<size_t>(g.batch * g.length), model_.pad);
    for (int64_t b = 0; b < g.batch; ++b)
      std::copy(rows[b].begin(), rows[b].end(), g.src.begin() + b * g.length);
    g.rows = std::move(rows);
    // Concurrent requests of one search run as one batch where that gives each the answer it
    // gets alone: not sampling (its draws depend on the batch), not streaming.
    job->rows = g.batch;
    job->max_rows = a_.no_batching ? 1 : std::max<int64_t>(max_batch, 1);
    if (a_.max_batch > 0) job->max_rows = std::min(job->max_rows, a_.max_batch);
    // A model whose requests join a running generation (Model::joins) streams them there.
    if ((!g.stream || model_.joins) && g.search.sampling_top_k == 1 && job->max_rows > 1) {
      const kiln_search_options& o = g.search;
      // (Requests that join a running generation each give it their max_decoding_length.)
      job->key =
          fmt::format("generate {} {} {} {} {} {} {} [{}] [{}]", o.beam_size, o.num_hypotheses,
                      model_.joins ? "*" : std::to_string(o.max_decoding_length),
                      o.min_decoding_length, o.length_penalty, o.start_id, o.end_id,
                      fmt::join(g.stop_ids, ","), fmt::join(g.vocabulary, ","));
    }
    std::string id;
    if (auto i = j.find("id"); i != j.end()) {
      if (!i->is_string()) bad("id: expected a string, got {}", brief(*i));
      id = i->get<std::string>();
    }
    if (!g.stream) {
      submit(job, res);
      if (job->error) bad("{}", *job->error);
      reply(res, 200, generation_json(*job, id));
      return;
    }
    if (!scheduler_.admit(job)) {
      res.set_header("Retry-After", "1");
      throw HttpError{503, fmt::format("the request queue is full ({} requests waiting or "
                                       "running, --max-queue); retry later",
                                       a_.max_queue)};
    }
    const auto deadline = Clock::now() + timeout_;
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider(
        "text/event-stream", [this, job, id, deadline](size_t, httplib::DataSink& sink) {
          std::unique_lock<std::mutex> l(job->m);
          const bool ready =
              job->cv.wait_until(l, deadline, [&] { return !job->tokens.empty() || job->done; });
          std::string events;
          while (!job->tokens.empty()) {
            const int64_t t = job->tokens.front();
            job->tokens.pop_front();
            json e{{"token", t}};
            if (tgt_vocab_ && t >= 0 && t < tgt_vocab_->size()) {
              if (!job->text) job->text = std::make_unique<kiln::tok::StreamDecoder>(*tgt_vocab_);
              e["text"] = job->text->push(t);  // whole UTF-8 characters only
            }
            events += "data: " + e.dump() + "\n\n";
          }
          const bool done = job->done;
          l.unlock();
          if (!events.empty() && !sink.write(events.data(), events.size())) {
            job->cancelled = true;  // the client is gone
            return false;
          }
          if (!ready) {
            job->cancelled = true;
            const std::string e = "event: error\ndata: " +
                                  json{{"error", fmt::format("the request took longer than {} ms "
                                                             "(--request-timeout-ms)",
                                                             a_.request_timeout_ms)}}
                                      .dump() +
                                  "\n\n";
            sink.write(e.data(), e.size());
            sink.done();
            return true;
          }
          if (done) {
            const std::string e =
                job->error ? "event: error\ndata: " + json{{"error", *job->error}}.dump() + "\n\n"
                           : "event: done\ndata: " + generation_json(*job, id).dump() + "\n\n";
            sink.write(e.data(), e.size());
            sink.done();
          }
          return true;
        });
  }

  json generation_json(const Job& job, const std::string& id) const {
    json results = json::array();
    for (const auto& sentence : job.hypotheses) {
      json hyps = json::array();
      for (const Job::Hypothesis& h : sentence) {
        const std::vector<int64_t>& ids = h.ids;
        json hyp{{"ids", ids}, {"score", h.score}};
        if (tgt_vocab_) {
          try {
            hyp["text"] = tgt_vocab_->decode(ids);
          } catch (const std::runtime_error& e) {
            hyp["text_error"] = e.what();
          }
        }
        hyps.push_back(std::move(hyp));
      }
      results.push_back(json{{"hypotheses", std::move(hyps)}});
    }
    json body{{"model_name", model_.lib.name}, {"results", std::move(results)}};
    if (!id.empty()) body["id"] = id;
    return body;
  }

  const ServeArgs& a_;
  const Model& model_;
  Metrics metrics_;
  Scheduler scheduler_;
  std::chrono::milliseconds timeout_;
  std::unique_ptr<kiln::tok::Tokenizer> src_vocab_, tgt_vocab_;  // tokenizers/tokenizer.h
  bool causal_ = false, generates_ = false;
  std::atomic<bool> draining_{false};
  std::atomic<int64_t> open_connections_{0};
  std::atomic<int64_t> last_accept_{0};  // when the last connection came (Clock ticks)
};

}  // namespace

int cmd_serve(const std::vector<std::string>& argv) {
  ServeArgs a;
  if (!parse_command(*serve_command(a), argv)) return 0;
  if (a.src_vocab.empty() != a.tgt_vocab.empty())
    fail("serve: --src-vocab and --tgt-vocab go together");
  // Every thread started from here on blocks these: the server's signal thread takes them.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  signal(SIGPIPE, SIG_IGN);
  static Model model = open_model(a);  // lives as long as the process (workers may outlive)
  Server server(a, model);
  return server.run();
}

}  // namespace kiln::tools
