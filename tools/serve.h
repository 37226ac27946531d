// kiln serve: an HTTP server over one compiled model's shared library (kiln compile
// --emit=shared) speaking the Open Inference Protocol's REST form (KServe v2), plus a generation
// endpoint; run by kiln-run (no libHalide), to which `kiln serve` hands its command line.
#pragma once

#include <string>
#include <vector>

namespace kiln::tools {

// kiln serve ARGV... (see its --help): serves until SIGTERM or SIGINT, then drains (every
// accepted request is answered) and returns 0.
int cmd_serve(const std::vector<std::string>& argv);

}  // namespace kiln::tools
