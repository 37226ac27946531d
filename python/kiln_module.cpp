// The `kiln` Python module (issue 28; pybind11): a compiled model's shared library (`kiln
// compile --emit=shared`) loaded through its own C ABI (runtime/library_api.h: the module links
// no libHalide), its entry points run on NumPy arrays and its generation (greedy, beam,
// sampling, streaming through a Python callback); tokenizers (tokenizers/tokenizer.h). See the
// project README, "Python".
//
//   import kiln
//   m = kiln.Model("build/numbers", "numbers.safetensors", threads=2)
//   m.entry_points                    # {"forward": {"inputs": [...], "outputs": [...]}, ...}
//   logits = m.run("forward", src, tgt)    # or m.forward(src, tgt), or by name: src=..., tgt=...
//   g = m.generate(src, beam_size=4)       # {"ids", "lengths", "scores", "tokens"}
//
// Inputs: NumPy arrays (or anything numpy.asarray takes) of the entry point's dtype, read in
// place when they are C-contiguous and of that dtype (else converted once); ids may be int64 or
// int32. Outputs: NumPy arrays the kernels write directly (no copy out). The GIL is released
// while the kernels run, so Python threads calling one model run in parallel. Every error of
// the runtime (a bad id, a length above the maximum, a missing weight) is a kiln.Error
// (a RuntimeError) carrying kiln's message.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kiln/runtime.h"
#include "runtime/library_api.h"
#include "support/error.h"
#include "tokenizers/tokenizer.h"

namespace py = pybind11;

namespace kiln::python {
namespace {

const char* dtype_name(int32_t dtype) {
  switch (dtype) {
    case KILN_F32:
      return "float32";
    case KILN_I64:
      return "int64";
    case KILN_BOOL:
      return "bool";
    case KILN_I32:
      return "int32";
    default:
      return "unknown";
  }
}

// A model created from a library; destroyed with the Python object.
class Model {
 public:
  Model(const std::string& library, const std::optional<std::string>& weights, int threads)
      : lib_(rt::open_library(library, "kiln.Model")) {
    char* error = nullptr;
    {
      py::gil_scoped_release unlocked;
      model_ = lib_.api.create(weights ? weights->c_str() : nullptr, &error);
    }
    if (!model_) {
      const std::string message = error ? error : "model creation failed";
      lib_.api.free_error(error);
      throw Error(message);
    }
    if (threads > 0) lib_.api.set_num_threads(model_, threads);
  }
  ~Model() {
    if (model_) lib_.api.destroy(model_);
  }
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  std::string name() const { return lib_.name; }
  std::string path() const { return lib_.path; }

  std::vector<std::string> functions() const {
    std::vector<std::string> out;
    for (const char* const* f = lib_.api.functions(model_); *f; ++f) out.emplace_back(*f);
    return out;
  }

  // {name: {"inputs": [...], "outputs": [...]}}, each tensor {"name", "dtype", "shape"} with
  // the shape's dims as ints (constant) or strings (symbols: "B", "T+1").
  py::dict entry_points() const {
    py::dict out;
    for (const std::string& f : functions()) {
      py::dict e;
      for (int output : {0, 1}) {
        py::list tensors;
        const int n = output ? lib_.api.num_outputs(model_, f.c_str())
                             : lib_.api.num_inputs(model_, f.c_str());
        for (int i = 0; i < n; ++i) {
          kiln_tensor_type t{};
          if (lib_.api.tensor_type(model_, f.c_str(), output, i, &t) != 0) continue;
          py::list shape;
          for (int d = 0; d < t.rank; ++d) {
            if (t.dim[d])
              shape.append(py::str(t.dim[d]));
            else
              shape.append(py::int_(t.extent[d]));
          }
          py::dict td;
          td["name"] = t.name;
          td["dtype"] = dtype_name(t.dtype);
          td["shape"] = shape;
          tensors.append(td);
        }
        e[output ? "outputs" : "inputs"] = tensors;
      }
      out[py::str(f)] = e;
    }
    return out;
  }

  // Runs `function` on `args` (by position) or `kwargs` (by input name): one NumPy array, or a
  // tuple of them for several outputs.
  py::object run(const std::string& function, py::args args, py::kwargs kwargs) {
    const char* fn = function.c_str();
    const int n_in = lib_.api.num_inputs(model_, fn);
    if (n_in < 0) {
      std::string known;
      for (const std::string& f : functions()) known += (known.empty() ? "" : ", ") + f;
      throw Error(fmt::format("model '{}' has no entry point '{}' (it has: {})", lib_.name,
                              function, known));
    }
    if (args.size() && kwargs.size())
      throw Error(fmt::format("{}: give the inputs by position or by name, not both", function));
    if (static_cast<int>(args.size() + kwargs.size()) != n_in)
      throw Error(
          fmt::format("{} takes {} input(s), got {}", function, n_in, args.size() + kwargs.size()));
    for (auto item : kwargs) {
      const std::string key = py::str(item.first);
      bool known = false;
      for (int i = 0; i < n_in; ++i) known = known || key == lib_.api.input_name(model_, fn, i);
      if (!known) throw Error(fmt::format("{} has no input '{}'", function, key));
    }
    std::vector<py::array> keep;  // the arrays the tensors point into, alive over the call
    std::vector<kiln_tensor> in(static_cast<size_t>(n_in));
    for (int i = 0; i < n_in; ++i) {
      kiln_tensor_type type{};
      lib_.api.tensor_type(model_, fn, 0, i, &type);
      py::object value;
      if (args.size()) {
        value = args[static_cast<size_t>(i)];
      } else {
        if (!kwargs.contains(type.name))
          throw Error(fmt::format("{}: input '{}' is missing", function, type.name));
        value = kwargs[type.name];
      }
      in[static_cast<size_t>(i)] = tensor_of(value, type, function, &keep);
    }
    const int n_out = lib_.api.num_outputs(model_, fn);
    std::vector<kiln_tensor> out(static_cast<size_t>(n_out));
    if (lib_.api.output_shapes(model_, fn, in.data(), in.size(), out.data(), out.size()) != 0)
      throw Error(lib_.api.error(model_));
    std::vector<py::array> results;
    for (int r = 0; r < n_out; ++r) {
      kiln_tensor& t = out[static_cast<size_t>(r)];
      std::vector<py::ssize_t> shape(t.shape, t.shape + t.rank);
      py::array a = t.dtype == KILN_F32   ? py::array(py::dtype::of<float>(), shape)
                    : t.dtype == KILN_I64 ? py::array(py::dtype::of<int64_t>(), shape)
                                          : py::array(py::dtype("bool"), shape);
      // A cache output updates its input in place: the caller's array is both.
      if (const int p = lib_.api.output_updates(model_, fn, r); p >= 0 && p < n_in) {
        a = keep[static_cast<size_t>(p)];
        t.data = in[static_cast<size_t>(p)].data;
        t.capacity = in[static_cast<size_t>(p)].capacity;
      } else {
        t.data = a.mutable_data();
        t.capacity = static_cast<size_t>(a.nbytes());
      }
      results.push_back(a);
    }
    int status;
    {
      py::gil_scoped_release unlocked;
      status = lib_.api.run(model_, fn, in.data(), in.size(), out.data(), out.size());
    }
    if (status != 0) throw Error(lib_.api.error(model_));
    if (results.size() == 1) return results[0];
    py::tuple t(results.size());
    for (size_t i = 0; i < results.size(); ++i) t[i] = results[i];
    return t;
  }

  // kiln_generate with its options as keywords; on_token(sentence, step, token) is called
  // for each token as it is chosen (beam_size 1). Returns {"ids": int64 [batch, hypotheses,
  // max_length] (-1 past each hypothesis), "lengths": int64 [batch, hypotheses], "scores":
  // float32 [batch, hypotheses], "tokens": the ids as lists, per sentence per hypothesis}.
  py::dict generate(const py::object& src, int beam_size, int num_hypotheses,
                    int max_decoding_length, int min_decoding_length, float length_penalty,
                    int64_t start_id, int64_t end_id, int sampling_top_k,
                    float sampling_temperature, float sampling_top_p, uint64_t seed,
                    const std::vector<int64_t>& stop_ids, const py::object& on_token,
                    const std::vector<int64_t>& vocabulary) {
    std::vector<py::array> keep;
    kiln_tensor_type ids_type{};
    ids_type.name = "src";
    ids_type.dtype = KILN_I64;
    ids_type.rank = 2;
    kiln_tensor in = tensor_of(src, ids_type, "generate", &keep);
    kiln_search_options o;
    lib_.api.search_options_init(&o);
    o.beam_size = beam_size;
    o.num_hypotheses = num_hypotheses;
    o.max_decoding_length = max_decoding_length;
    o.min_decoding_length = min_decoding_length;
    o.length_penalty = length_penalty;
    o.start_id = start_id;
    o.end_id = end_id;
    o.sampling_top_k = sampling_top_k;
    o.sampling_temperature = sampling_temperature;
    o.sampling_top_p = sampling_top_p;
    o.seed = seed;
    o.stop_ids = stop_ids.data();
    o.num_stop_ids = static_cast<int32_t>(stop_ids.size());
    o.vocabulary = vocabulary.empty() ? nullptr : vocabulary.data();
    o.num_vocabulary = static_cast<int32_t>(vocabulary.size());
    struct Stream {
      py::object callback;
      std::optional<py::error_already_set> error;
    } stream{on_token, std::nullopt};
    if (!on_token.is_none()) {
      if (!PyCallable_Check(on_token.ptr()))
        throw Error("generate: on_token must be callable as on_token(sentence, step, token)");
      o.on_token = [](void* user, int64_t sentence, int64_t step, int64_t token) {
        auto* s = static_cast<Stream*>(user);
        py::gil_scoped_acquire locked;
        if (s->error) return;  // the callback failed already: its error is raised at the end
        try {
          s->callback(sentence, step, token);
        } catch (py::error_already_set& e) {
          s->error.emplace(std::move(e));
        }
      };
      o.user_data = &stream;
    }
    kiln_generation g{};
    int status;
    {
      py::gil_scoped_release unlocked;
      status = lib_.api.generate(model_, &in, &o, &g);
    }
    std::unique_ptr<kiln_generation, void (*)(kiln_generation*)> owned(&g,
                                                                       lib_.api.generation_free);
    if (stream.error) throw std::move(*stream.error);
    if (status != 0) throw Error(lib_.api.error(model_));
    const py::ssize_t B = g.batch, H = g.hypotheses, L = g.max_length;
    py::array_t<int64_t> ids({B, H, L});
    py::array_t<int64_t> lengths({B, H});
    py::array_t<float> scores({B, H});
    std::memcpy(ids.mutable_data(), g.ids, static_cast<size_t>(B * H * L) * sizeof(int64_t));
    std::memcpy(lengths.mutable_data(), g.lengths, static_cast<size_t>(B * H) * sizeof(int64_t));
    std::memcpy(scores.mutable_data(), g.scores, static_cast<size_t>(B * H) * sizeof(float));
    py::list tokens;
    for (py::ssize_t b = 0; b < B; ++b) {
      py::list hyps;
      for (py::ssize_t h = 0; h < H; ++h) {
        py::list t;
        for (int64_t i = 0; i < g.lengths[b * H + h]; ++i) t.append(g.ids[(b * H + h) * L + i]);
        hyps.append(t);
      }
      tokens.append(hyps);
    }
    py::dict out;
    out["ids"] = ids;
    out["lengths"] = lengths;
    out["scores"] = scores;
    out["tokens"] = tokens;
    return out;
  }

  int set_num_threads(int threads) { return lib_.api.set_num_threads(model_, threads); }
  // kiln_model_save_weights: the weights as the runtime lays them out, one file to map.
  void save_weights(const std::string& path) {
    if (!lib_.api.save_weights)
      throw Error("library '" + lib_.path +
                  "' was compiled by a kiln without kiln_model_save_weights: compile it again");
    if (lib_.api.save_weights(model_, path.c_str()) != 0) throw Error(lib_.api.error(model_));
  }
  int64_t symbol_max(const std::string& symbol) const {
    return lib_.api.symbol_max(model_, symbol.c_str());
  }
  std::optional<std::string> config(const std::string& key) const {
    const char* v = lib_.api.config(model_, key.c_str());
    return v ? std::optional<std::string>(v) : std::nullopt;
  }

 private:
  // The C ABI tensor of `value` as input `type` of `function`: the array itself where it is
  // C-contiguous and of the input's dtype (int32 ids too), else a converted copy (kept).
  kiln_tensor tensor_of(const py::object& value, const kiln_tensor_type& type,
                        const std::string& function, std::vector<py::array>* keep) const {
    py::array a;
    try {
      a = py::array::ensure(value);
    } catch (const py::error_already_set&) {
    }
    if (!a) throw Error(fmt::format("{}: input '{}' is not an array", function, type.name));
    const bool contiguous = (a.flags() & py::array::c_style) != 0;
    kiln_tensor t{};
    t.name = type.name;
    if (type.dtype == KILN_F32) {
      if (!contiguous || !a.dtype().is(py::dtype::of<float>())) {
        if (a.dtype().kind() != 'f' && a.dtype().kind() != 'i' && a.dtype().kind() != 'u')
          throw Error(fmt::format("{}: input '{}' must be float32, got {}", function, type.name,
                                  std::string(py::str(a.dtype()))));
        a = py::array_t<float, py::array::c_style | py::array::forcecast>::ensure(a);
      }
      t.dtype = KILN_F32;
    } else if (type.dtype == KILN_I64) {
      if (a.dtype().kind() != 'i' && a.dtype().kind() != 'u')
        throw Error(fmt::format("{}: input '{}' must be integer ids (int64 or int32), got {}",
                                function, type.name, std::string(py::str(a.dtype()))));
      if (contiguous && a.dtype().is(py::dtype::of<int32_t>())) {
        t.dtype = KILN_I32;
      } else {
        if (!contiguous || !a.dtype().is(py::dtype::of<int64_t>()))
          a = py::array_t<int64_t, py::array::c_style | py::array::forcecast>::ensure(a);
        t.dtype = KILN_I64;
      }
    } else {
      if (!contiguous || a.dtype().kind() != 'b')
        a = py::array::ensure(a.attr("astype")("bool"), py::array::c_style);
      t.dtype = KILN_BOOL;
    }
    if (a.ndim() > KILN_MAX_RANK)
      throw Error(fmt::format("{}: input '{}' has rank {}, more than {}", function, type.name,
                              a.ndim(), KILN_MAX_RANK));
    t.rank = static_cast<int32_t>(a.ndim());
    for (py::ssize_t d = 0; d < a.ndim(); ++d) t.shape[d] = a.shape(d);
    t.data = const_cast<void*>(a.data());
    t.capacity = static_cast<size_t>(a.nbytes());
    keep->push_back(a);
    return t;
  }

  rt::Library lib_;
  kiln_model* model_ = nullptr;
};

}  // namespace
}  // namespace kiln::python

PYBIND11_MODULE(kiln, m) {
  using kiln::python::Model;
  m.doc() =
      "kiln: compiled Transformer models (kiln compile --emit=shared) from Python. "
      "kiln.Model(library, weights) loads one; see the project README, \"Python\".";
  static py::exception<kiln::Error> error(m, "Error", PyExc_RuntimeError);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const kiln::Error& e) {
      PyErr_SetString(error.ptr(), e.what());
    }
  });
  // Tokenizers (tokenizers/tokenizer.h): text in and out.
  using kiln::tok::StreamDecoder;
  using kiln::tok::Tokenizer;
  py::class_<Tokenizer>(
      m, "Tokenizer",
      "A tokenizer: a SentencePiece model (*.model), a byte-level BPE (vocab.json "
      "with merges.txt beside it, or their folder), or kiln translate's "
      "character vocabulary (one token per line).")
      .def(py::init([](const std::string& path) { return kiln::tok::load_tokenizer(path); }),
           py::arg("path"))
      .def_property_readonly(
          "kind", [](const Tokenizer& t) { return std::string(t.kind()); },
          "'sentencepiece', 'bpe' or 'chars'")
      .def_property_readonly("path", &Tokenizer::path)
      .def_property_readonly("size", &Tokenizer::size)
      .def("encode", &Tokenizer::encode, py::arg("text"), "the ids of `text`")
      .def("decode", &Tokenizer::decode, py::arg("ids"),
           "the text of `ids` (special tokens left out)")
      .def("id", &Tokenizer::id, py::arg("token"), "a token's id, -1 if absent")
      .def(
          "stream", [](const Tokenizer& t) { return std::make_unique<StreamDecoder>(t); },
          py::keep_alive<0, 1>(),
          "a streaming detokenizer: push(id) returns the text the id completes (whole UTF-8 "
          "characters only), finish() the rest");
  py::class_<StreamDecoder>(m, "StreamDecoder")
      .def("push", &StreamDecoder::push, py::arg("id"))
      .def("finish", &StreamDecoder::finish);
  py::class_<Model>(m, "Model",
                    "A compiled model: its library (the directory kiln compile --emit=shared "
                    "wrote, or its lib<name>.so) and weights (safetensors by state_dict name; None "
                    "for a model without weights).")
      .def(py::init<const std::string&, const std::optional<std::string>&, int>(),
           py::arg("library"), py::arg("weights") = py::none(), py::arg("threads") = 0)
      .def_property_readonly("name", &Model::name, "the model's name (lib<name>.so)")
      .def_property_readonly("path", &Model::path, "the library's path")
      .def_property_readonly("entry_points", &Model::entry_points,
                             "{function: {'inputs': [...], 'outputs': [...]}}, each tensor "
                             "{'name', 'dtype', 'shape'} with symbolic dims as strings")
      .def("run", &Model::run, py::arg("function"),
           "run(function, *inputs) or run(function, **inputs): NumPy arrays in, the output "
           "array (a tuple for several) out")
      .def("__getattr__",
           [](py::object self, const std::string& name) -> py::object {
             Model& model = self.cast<Model&>();
             for (const std::string& f : model.functions())
               if (f == name)
                 return py::cpp_function([self, name](py::args args, py::kwargs kwargs) {
                   return self.attr("run")(name, *args, **kwargs);
                 });
             throw py::attribute_error("kiln.Model has no attribute or entry point '" + name + "'");
           })
      .def("generate", &Model::generate, py::arg("src"), py::kw_only(), py::arg("beam_size") = 1,
           py::arg("num_hypotheses") = 1, py::arg("max_decoding_length") = 0,
           py::arg("min_decoding_length") = 0, py::arg("length_penalty") = 0.0f,
           py::arg("start_id") = -1, py::arg("end_id") = -1, py::arg("sampling_top_k") = 1,
           py::arg("sampling_temperature") = 1.0f, py::arg("sampling_top_p") = 1.0f,
           py::arg("seed") = 0, py::arg("stop_ids") = std::vector<int64_t>{},
           py::arg("on_token") = py::none(), py::arg("vocabulary") = std::vector<int64_t>{},
           "greedy search, beam search or sampling (kiln_generate; defaults as "
           "kiln_search_options_init; vocabulary: the target ids to choose from, empty: all); "
           "returns {'ids', 'lengths', 'scores', 'tokens'}")
      .def("set_num_threads", &Model::set_num_threads, py::arg("threads"))
      .def("save_weights", &Model::save_weights, py::arg("path"),
           "write the weights as the runtime lays them out (what `kiln pack-weights` writes): "
           "given as a Model's weights, the file is mapped, so processes share one copy")
      .def("symbol_max", &Model::symbol_max, py::arg("symbol"),
           "the declared maximum of a shape symbol ('B', 'T'), -1 if none")
      .def("config", &Model::config, py::arg("key"), "a model config value, None if absent");
}
