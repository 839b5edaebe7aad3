"""Hides torch from every interpreter that has this folder on PYTHONPATH (the tests' stand-in
for a venv installed without the ``multinode`` extra): the controller's, Triton's stub's, the ranks'."""

import sys


class _NoTorch:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ModuleNotFoundError("No module named 'torch'", name="torch")


sys.meta_path.insert(0, _NoTorch())
