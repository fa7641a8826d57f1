"""Modules that read, hash and summarise bytes import without torch (``import torch`` costs a CLI
process ~3 s): each is imported in a fresh interpreter, which must not have loaded torch."""

from __future__ import annotations

import subprocess
import sys

import pytest

_CHECK = """
import sys, traceback

class Witness:
    '''Records who imports torch first; finds nothing itself.'''
    stack = None

    def find_spec(self, name, path=None, target=None):
        if name == "torch" and Witness.stack is None:
            Witness.stack = "".join(traceback.format_stack(limit=25))
        return None

sys.meta_path.insert(0, Witness())
import importlib
importlib.import_module(sys.argv[1])
if "torch" in sys.modules:
    print(Witness.stack)
    sys.exit(1)
"""


@pytest.mark.parametrize("module", ["ckptrepo.dtypes", "ckptrepo.ingest.stats", "ckptrepo.formats.safetensors_file",
                                    "ckptrepo.testing"])
def test_module_imports_without_torch(module: str) -> None:
    done = subprocess.run([sys.executable, "-c", _CHECK, module], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"importing {module} imported torch:\n{done.stdout}{done.stderr}"
