"""Typed configuration: ``models.yaml`` and ``cluster.yaml``, validated with precise errors.

``schema`` holds the pydantic models, ``io`` the bounded YAML reader and the
error formatting, ``build`` turns validated config into the core's values.
The public API is importable from ``autoscaler.config``.
"""

from autoscaler.config.schema import *  # noqa: F401,F403
from autoscaler.config.schema import __all__  # noqa: F401
