# The test format of kiln's text tests (tests/lit.cfg.py): lit's ShTest, with the test's %t and
# %t.* removed before it runs, so that each run starts from no files of its own, as in a fresh
# temporary directory (no output a previous run left can make a test pass).
import glob
import os
import shutil

import lit.formats
import lit.TestRunner


class KilnShTest(lit.formats.ShTest):
    def execute(self, test, litConfig):
        _, tmp_base = lit.TestRunner.getTempPaths(test)
        for path in glob.glob(glob.escape(tmp_base) + ".tmp*"):
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path)
            else:
                os.remove(path)
        return super().execute(test, litConfig)
