// The model registry (see models.h).
#include "frontend/models.h"

#include "frontend/nn.h"
#include "support/error.h"

// The seed models: the write-ups kiln was started from, written as users write models
// (examples/seeds/*.cpp, KILN_MODEL) and compiled into kiln_models with KILN_MODEL_REGISTRY
// (frontend/CMakeLists.txt), which makes each define its kiln_model_info_<name>().
kiln::models::ModelInfo kiln_model_info_seed0_neginf_fill();
kiln::models::ModelInfo kiln_model_info_seed1_custom_layernorm();
kiln::models::ModelInfo kiln_model_info_seed2_tied_generator();
kiln::models::ModelInfo kiln_model_info_seed3_query_mask();
kiln::models::ModelInfo kiln_model_info_seed4_no_final_norm();

namespace kiln::models {
namespace {

nn::TransformerConfig to_transformer_config(const Config& c) {
  nn::TransformerConfig t;
  t.src_vocab = c.at("src_vocab");
  t.tgt_vocab = c.at("tgt_vocab");
  t.d_model = c.at("d_model");
  t.heads = c.at("heads");
  t.d_ff = c.at("d_ff");
  t.enc_layers = c.at("enc_layers");
  t.dec_layers = c.at("dec_layers");
  t.pad_id = c.at("pad_id");
  t.max_len = c.at("max_len");
  t.max_batch = c.at("max_batch");
  t.max_beam = c.at("max_beam");
  t.bos_id = c.at("bos_id");
  t.eos_id = c.at("eos_id");
  return t;
}

std::vector<ModelInfo> make_registry() {
  ModelInfo transformer;
  transformer.name = "transformer";
  transformer.description =
      "encoder-decoder Transformer of \"Attention Is All You Need\" (post-norm), kiln's reference: "
      "kiln's names, final norms, -1e9, untied generator, incremental decoding (decode_step)";
  // The paper's base model; vocabularies of 32000 on both sides.
  transformer.configs["base"] = {{"src_vocab", 32000}, {"tgt_vocab", 32000}, {"d_model", 512},
                                 {"heads", 8},         {"d_ff", 2048},       {"enc_layers", 6},
                                 {"dec_layers", 6},    {"pad_id", 0},        {"max_len", 128},
                                 {"max_batch", 16},    {"max_beam", 4},      {"bos_id", 1},
                                 {"eos_id", 2}};
  // The golden test models (tests/golden/make_golden.py).
  transformer.configs["tiny"] = {
      {"src_vocab", 37}, {"tgt_vocab", 41}, {"d_model", 24}, {"heads", 3},    {"d_ff", 40},
      {"enc_layers", 2}, {"dec_layers", 2}, {"pad_id", 0},   {"max_len", 40}, {"max_batch", 4},
      {"max_beam", 4},   {"bos_id", 1},     {"eos_id", 2}};
  transformer.configs["small"] = {
      {"src_vocab", 53}, {"tgt_vocab", 29}, {"d_model", 20}, {"heads", 5},    {"d_ff", 36},
      {"enc_layers", 1}, {"dec_layers", 3}, {"pad_id", 1},   {"max_len", 48}, {"max_batch", 3},
      {"max_beam", 4},   {"bos_id", 2},     {"eos_id", 3}};
  // The shipped example model: English number words to digits (examples/numbers/train.py),
  // character-level; source ids are characters, the decoder starts from <s> (1) and ends
  // with </s> (2).
  transformer.configs["numbers"] = {
      {"src_vocab", 24}, {"tgt_vocab", 13}, {"d_model", 64}, {"heads", 4},    {"d_ff", 256},
      {"enc_layers", 3}, {"dec_layers", 2}, {"pad_id", 0},   {"max_len", 80}, {"max_batch", 32},
      {"max_beam", 4},   {"bos_id", 1},     {"eos_id", 2}};
  transformer.build = [](const Config& c) {
    return nn::build_transformer(to_transformer_config(c));
  };
  return {transformer,
          kiln_model_info_seed0_neginf_fill(),
          kiln_model_info_seed1_custom_layernorm(),
          kiln_model_info_seed2_tied_generator(),
          kiln_model_info_seed3_query_mask(),
          kiln_model_info_seed4_no_final_norm()};
}

}  // namespace

const std::vector<ModelInfo>& registry() {
  static const std::vector<ModelInfo> models = make_registry();
  return models;
}

const ModelInfo& find_model(const std::string& name) {
  std::string known;
  for (const ModelInfo& m : registry()) {
    if (m.name == name) return m;
    known += (known.empty() ? "" : ", ") + m.name;
  }
  fail("unknown model '{}' (known: {})", name, known);
}

ir::Module build_model(const std::string& model, const std::string& config_name,
                       const std::vector<std::string>& overrides) {
  const ModelInfo& info = find_model(model);
  return info.build(resolve_config(info, config_name, overrides));
}

}  // namespace kiln::models
