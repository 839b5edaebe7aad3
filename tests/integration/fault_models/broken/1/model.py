"""A model that can never load: the fault the crash-loop tests inject (a missing weights file)."""


class TritonPythonModel:
    def initialize(self, args):
        raise RuntimeError("cannot open weights /nonexistent/broken.bin: No such file or directory")

    def execute(self, requests):  # pragma: no cover - never reached
        return []
