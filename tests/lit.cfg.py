# kiln's text tests, run by LLVM's lit (lit.py from Debian's llvm-14-tools): every `# RUN:`
# line of a test is a command of lit's shell (pipes with `set -o pipefail`, redirections,
# quotes; the lines run in order, the first failure fails the test), with these substitutions:
#   %kiln       the kiln binary of the build (lit.site.cfg.py, configured by CMake)
#   %s          the test file;  %t  a path of the test's own in the build folder (%t.log, ...)
#   FileCheck, not   LLVM's, from the LLVM tools folder (put first on PATH)
# Which files are tests is said per folder by lit.local.cfg: every .kir file under passes/
# (a new folder there is found without any other change), the .kir files of gpu/ that have
# a RUN line; lit_runner/ holds the runner's own failing fixtures, run only when named.
# Run through the build's wrapper, which maps this file to the build's site config:
#   build/bin/kiln-lit -v tests              # all of them
#   build/bin/kiln-lit -v tests/passes/fuse-linear/bias.kir
import os
import sys

# The test format (lit_format.py, a module so that lit's worker processes can unpickle it).
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import lit_format  # noqa: E402

config.name = "kiln"
config.test_format = lit_format.KilnShTest(execute_external=False)
config.suffixes = []  # per folder: lit.local.cfg
config.test_source_root = os.path.dirname(os.path.abspath(__file__))
if not hasattr(config, "kiln_path"):
    lit_config.fatal("run kiln's text tests through build/bin/kiln-lit (or lit on build/tests): "
                     "the build's lit.site.cfg.py names the kiln binary")
config.test_exec_root = os.path.join(config.kiln_obj_root, "tests")

config.substitutions.append(("%kiln", config.kiln_path))
config.environment["PATH"] = os.pathsep.join([config.llvm_tools_dir, config.environment["PATH"]])
