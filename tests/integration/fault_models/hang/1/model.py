"""A model whose initialize never returns (a download that hangs): its server never turns ready."""

import threading


class TritonPythonModel:
    def initialize(self, args):
        threading.Event().wait()  # forever

    def execute(self, requests):  # pragma: no cover - never reached
        return []
