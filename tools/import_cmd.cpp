// `kiln import`: see tools/import_cmd.h.
#include "tools/import_cmd.h"

#include <filesystem>
#include <map>

#include <fmt/format.h>

#include "import/onnx_import.h"
#include "ir/printer.h"
#include "support/error.h"
#include "tools/cli.h"

namespace kiln::tools {

int cmd_import(const std::vector<std::string>& argv) {
  std::string file, output, weights_out, function = "forward", name;
  std::vector<std::string> dims;
  auto app = make_command(
      "import", "MODEL.onnx -o MODEL.kir [--weights-out W.safetensors] [--dim NAME=MAX]...",
      "Reads an ONNX model (opsets 13-17, as torch.onnx.export writes them) and writes it as\n"
      "kiln IR (.kir) with one entry point, and its initializers as a safetensors file under\n"
      "their ONNX names. The IR is ordinary: 'kiln opt', 'kiln run' and 'kiln compile' take it\n"
      "as they take a model written in the DSL, and their passes fuse it the same way.\n"
      "Each dynamic dim of the graph's inputs (a dim_param, e.g. torch.onnx.export's\n"
      "dynamic_axes names) becomes a kiln symbol and needs a maximum: --dim NAME=MAX.");
  app->add_option("MODEL", file, "the ONNX model (.onnx)")->required();
  app->add_option("-o", output, "the IR file to write ('-': standard output)")
      ->type_name("FILE")
      ->required();
  app->add_option("--weights-out", weights_out,
                  "the weights file to write (default: the -o file with the extension "
                  ".safetensors)")
      ->type_name("FILE");
  app->add_option("--dim", dims,
                  "the maximum of a dynamic dim, by its ONNX name (repeatable), e.g. --dim "
                  "batch=8 --dim seq=512")
      ->type_name("NAME=MAX");
  app->add_option("--function", function, "the entry point's name")->capture_default_str();
  app->add_option("--name", name, "the module's name (default: the model file's stem)")
      ->type_name("NAME");
  if (!parse_command(*app, argv)) return 0;

  importer::OnnxImportOptions options;
  for (const std::string& d : dims) {
    size_t eq = d.find('=');
    int64_t max = 0;
    bool ok = eq != std::string::npos && eq > 0 && eq + 1 < d.size();
    if (ok) {
      try {
        size_t used = 0;
        max = std::stoll(d.substr(eq + 1), &used);
        ok = used == d.size() - eq - 1 && max >= 1;
      } catch (const std::exception&) {
        ok = false;
      }
    }
    if (!ok) fail("import: --dim '{}' must be NAME=MAX with MAX a positive integer", d);
    if (!options.dim_max.emplace(d.substr(0, eq), max).second)
      fail("import: --dim {} is given twice", d.substr(0, eq));
  }
  options.function = function;
  std::string stem = std::filesystem::path(file).stem().string();
  options.module_name = name;
  if (options.module_name.empty()) {
    for (char c : stem)
      options.module_name += std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
    if (options.module_name.empty() ||
        std::isdigit(static_cast<unsigned char>(options.module_name[0])))
      options.module_name = "m" + options.module_name;
  }
  if (weights_out.empty()) {
    if (output == "-") fail("import: with -o -, name the weights file with --weights-out");
    weights_out = std::filesystem::path(output).replace_extension(".safetensors").string();
  }
  importer::OnnxImport r = importer::import_onnx_file(file, options);
  write_output(output, ir::print_module(r.module));
  rt::write_safetensors(weights_out, r.weights);
  int64_t bytes = 0;
  for (const rt::TensorData& t : r.weights) bytes += static_cast<int64_t>(t.data.size());
  fmt::print(stderr,
             "kiln import: {} ONNX nodes (opset {}) -> {} kiln ops in @{}; {} weights "
             "({} bytes) -> {}\n",
             r.onnx_nodes, r.opset, r.module.functions[0].ops.size(), r.module.functions[0].name,
             r.weights.size(), bytes, weights_out);
  return 0;
}

}  // namespace kiln::tools
