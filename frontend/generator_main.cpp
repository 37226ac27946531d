// The main of a model generator program (see generator.h): parses the options, builds
// the user's model with the chosen config and writes its IR text.
#include <cstdio>
#include <exception>
#include <optional>
#include <string>
#include <vector>

#include "frontend/generator.h"
#include "ir/printer.h"
#include "support/error.h"
#include "support/file_io.h"

namespace kiln::generator {
namespace {

constexpr const char* kHelp = R"(usage: {0} [--config NAME] [--set key=value]... [-o FILE] [--list]

Writes the IR text (.kir) of model '{1}', for 'kiln compile'.

options:
  --config NAME     config to start from (default: the only config, or 'base')
  --set key=value   override one config key (repeatable), e.g. --set max_len=256
  -o FILE           output file; '-' or none: standard output
  --list            print the model's name, description and configs
)";

}  // namespace

int run(const models::ModelInfo& model, int argc, const char* const* argv) {
  const std::string program = argc > 0 ? argv[0] : "generator";
  try {
    std::optional<std::string> config, out;
    std::vector<std::string> sets;
    bool list = false;
    for (int i = 1; i < argc; ++i) {
      std::string arg = argv[i], value;
      const size_t eq = arg.find('=');
      const bool inline_value = arg.rfind("--", 0) == 0 && eq != std::string::npos;
      if (inline_value) {
        value = arg.substr(eq + 1);
        arg = arg.substr(0, eq);
      }
      auto next = [&]() -> std::string {
        if (inline_value) return value;
        if (i + 1 >= argc) fail("option '{}' needs a value", arg);
        return argv[++i];
      };
      if (arg == "--help" || arg == "-h") {
        std::fputs(fmt::format(kHelp, program, model.name).c_str(), stdout);
        return 0;
      } else if (arg == "--list") {
        list = true;
      } else if (arg == "--config") {
        config = next();
      } else if (arg == "--set") {
        sets.push_back(next());
      } else if (arg == "-o") {
        out = next();
      } else {
        fail("unknown argument '{}' (see '{} --help')", argv[i], program);
      }
    }
    if (list) {
      write_stdout(models::describe(model));
      return 0;
    }
    models::Config c =
        models::resolve_config(model, config ? *config : models::default_config(model), sets);
    ir::Module m = model.build(c);
    const std::string text = ir::print_module(m);
    if (!out || *out == "-")
      write_stdout(text);
    else
      write_file_atomically(*out, text);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: error: %s\n", program.c_str(), e.what());
    return 1;
  }
}

}  // namespace kiln::generator

int main(int argc, char** argv) {
  return kiln::generator::run(kiln::generator::model(), argc, argv);
}
