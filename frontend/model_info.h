// A model as the DSL describes it: a name, a description, named configs (their keys can be
// overridden: `--set d_model=256`) and the function that builds the IR from a config; and
// what a generator program (generator.h) and kiln's registry (models.h) do with configs.
// Installed with the DSL (kiln::dsl).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "ir/ir.h"

namespace kiln::models {

using Config = std::map<std::string, int64_t>;
using Configs = std::map<std::string, Config>;  // by config name

struct ModelInfo {
  std::string name;
  std::string description;
  Configs configs;  // "base", "tiny", ...
  std::function<ir::Module(const Config&)> build;
};

// Picks config `config_name` of `model` and applies "key=value" overrides. Unknown
// models, configs or keys and non-integer values throw kiln::Error naming them.
Config resolve_config(const ModelInfo& model, const std::string& config_name,
                      const std::vector<std::string>& overrides);

// The value of `key` in `config`; throws kiln::Error naming the key and the keys there are
// (for a model's build function reading a key that one of its configs lacks).
int64_t config_value(const Config& config, const std::string& key);

// The model's name, description and configs, as `kiln models` prints them.
std::string describe(const ModelInfo& model);

// The config used when none is named: the model's only config, or "base"; throws
// kiln::Error listing the configs when it has several and none is "base".
std::string default_config(const ModelInfo& model);

}  // namespace kiln::models
