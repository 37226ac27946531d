// The model registry: kiln's own models by name (`kiln models`, `kiln emit NAME`): the
// reference Transformer and the seed write-ups (examples/seeds), each with named configs
// whose keys can be overridden (`kiln emit transformer --config base --set d_model=256`).
// Models are listed explicitly in models.cpp (no static-constructor registry). The
// registry is the target kiln_models, which the kiln tool and the tests link; the installed
// DSL (kiln_frontend) holds none of it.
#pragma once

#include <string>
#include <vector>

#include "frontend/model_info.h"
#include "ir/ir.h"

namespace kiln::models {

const std::vector<ModelInfo>& registry();
// Throws kiln::Error listing the known models when `name` is unknown.
const ModelInfo& find_model(const std::string& name);

// find_model + resolve_config + build.
ir::Module build_model(const std::string& model, const std::string& config_name,
                       const std::vector<std::string>& overrides = {});

}  // namespace kiln::models
