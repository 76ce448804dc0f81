"""For child Pythons that must behave as on a machine without `hf_tinytx`: put BLOCK_HF_TINYTX
first in their code, and a model can only load through the code files saved next to its
weights (`trust_remote_code=True`)."""

BLOCK_HF_TINYTX = """
import importlib.abc, sys

class _BlockHfTinytx(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "hf_tinytx":
            raise ImportError(f"{name} is blocked in this test")

sys.meta_path.insert(0, _BlockHfTinytx())
"""
