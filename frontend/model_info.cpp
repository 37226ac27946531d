// Model configs (see model_info.h).
#include "frontend/model_info.h"

#include <charconv>

#include "support/error.h"

namespace kiln::models {

Config resolve_config(const ModelInfo& model, const std::string& config_name,
                      const std::vector<std::string>& overrides) {
  auto it = model.configs.find(config_name);
  if (it == model.configs.end()) {
    std::string known;
    for (const auto& [k, v] : model.configs) known += (known.empty() ? "" : ", ") + k;
    fail("model '{}' has no config '{}' (known: {})", model.name, config_name, known);
  }
  Config config = it->second;
  for (const std::string& o : overrides) {
    size_t eq = o.find('=');
    if (eq == std::string::npos || eq == 0) fail("--set '{}' is not of the form key=value", o);
    std::string key = o.substr(0, eq), value = o.substr(eq + 1);
    if (!config.count(key)) {
      std::string known;
      for (const auto& [k, v] : config) known += (known.empty() ? "" : ", ") + k;
      fail("unknown config key '{}' for model '{}' (keys: {})", key, model.name, known);
    }
    int64_t v = 0;
    auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
    if (ec != std::errc() || end != value.data() + value.size() || value.empty())
      fail("config key '{}' needs an integer, got '{}'", key, value);
    config[key] = v;
  }
  return config;
}

int64_t config_value(const Config& config, const std::string& key) {
  auto it = config.find(key);
  if (it != config.end()) return it->second;
  std::string known;
  for (const auto& [k, v] : config) known += (known.empty() ? "" : ", ") + k;
  fail("config has no key '{}' (keys: {})", key, known);
}

std::string describe(const ModelInfo& model) {
  std::string out = model.name + ": " + model.description + "\n";
  for (const auto& [name, config] : model.configs) {
    out += "  config " + name + ":";
    for (const auto& [k, v] : config) out += " " + k + "=" + std::to_string(v);
    out += "\n";
  }
  return out;
}

std::string default_config(const ModelInfo& model) {
  if (model.configs.size() == 1) return model.configs.begin()->first;
  if (model.configs.count("base")) return "base";
  std::string known;
  for (const auto& [k, v] : model.configs) known += (known.empty() ? "" : ", ") + k;
  fail("model '{}' has {} configs and none is 'base': choose one with --config (known: {})",
       model.name, model.configs.size(), known);
}

}  // namespace kiln::models
