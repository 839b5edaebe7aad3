"""Export step: the metrics APIs the HPA reads, /metrics, plan/status/history JSON and the web view.

Public entry points: :class:`ApiState` (the controller publishes each tick
into it), :func:`create_app`, :func:`serve_in_thread`, :class:`TlsSettings`.
"""

from autoscaler.api.app import ApiSettings, create_app
from autoscaler.api.server import ServerHandle, serve_in_thread
from autoscaler.api.state import ApiState
from autoscaler.api.tls import TlsSettings

__all__ = ["ApiSettings", "ApiState", "ServerHandle", "TlsSettings", "create_app", "serve_in_thread"]
