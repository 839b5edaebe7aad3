"""A model that loads, serves, and takes its server down 3 s later: a crash after readiness
(a backend that dies on its first batches). Each start turns ready before it crashes."""

import os
import signal
import threading


class TritonPythonModel:
    def initialize(self, args):
        # this stub's parent is its tritonserver: kill it as an out-of-memory kill would
        threading.Timer(3.0, os.kill, (os.getppid(), signal.SIGKILL)).start()

    def execute(self, requests):  # pragma: no cover - the tests send no requests
        return []
