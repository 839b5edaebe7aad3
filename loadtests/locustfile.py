"""Locust entry point: Triton load driven by a shape, judged against the models' SLOs.

Outside the loop, this produces the demand the autoscaler must meet and then
grades the result. The documented way to run it (``migscale loadtest`` prints
and runs exactly this line)::

    locust -f loadtests/locustfile.py --headless --host http://127.0.0.1:8000 \\
        --run-time 120s --csv results/locust --html results/report.html \\
        --models-yaml examples/models.yaml --models resnet:3,bert:1 \\
        --shape spike --base-rps 20 --peak-rps 80 --protocol http --results-dir results

How the rate is hit: every second the shape (``loadtests/shapes.py``) gives a
target total rate R(t) (and the per-model split). Users are one-at-a-time
clients, so a user cannot exceed 1/latency requests per second; the shape runs
``ceil(R / --user-rps)`` users (at most ``--users-max``) and paces each at
``R / users``: 95 req/s with ``--user-rps 10`` = 10 users at 9.5 req/s each.
One process only: the pacing lives in this process (see the measured ceiling
in the README before asking one process for more).

gRPC: grpcio's own threads would block gevent's hub, so ``init_gevent()``
makes its completion queue cooperative; it must run before any channel exists,
which is why it is at import time here.
"""

from __future__ import annotations

import math
import signal
import sys
from typing import ClassVar

import gevent
from locust import LoadTestShape, events

from loadtests import checks as checks_mod
from loadtests import shapes as shapes_mod
from loadtests import slo as slo_mod
from loadtests.triton_user import PACER, TritonUser, parse_weights, weights_from_file

try:  # must precede the first gRPC channel; harmless for HTTP runs
    import grpc.experimental.gevent as _grpc_gevent

    _grpc_gevent.init_gevent()
except Exception as _e:  # noqa: BLE001 - only gRPC runs need it; they fail loudly below
    _GRPC_GEVENT_ERROR: Exception | None = _e
else:
    _GRPC_GEVENT_ERROR = None


@events.init_command_line_parser.add_listener
def _add_arguments(parser) -> None:
    g = parser.add_argument_group("migscale", "Triton load shapes and SLO verdict")
    g.add_argument("--models", default="", help="model weights, e.g. resnet:3,bert:1")
    g.add_argument("--models-file", default="", help="YAML {model: weight} (or a models.yaml)")
    g.add_argument("--models-yaml", default="", help="models.yaml: SLO targets (and models if --models is empty)")
    g.add_argument("--protocol", default="http", choices=["http", "grpc"], help="Triton protocol")
    g.add_argument("--shape", default="constant", help=f"one of {', '.join(shapes_mod.SHAPES)}")
    g.add_argument("--shape-args", default="", help="k=v,... e.g. spike_at_s=30,spike_s=20 or path=trace.csv")
    g.add_argument("--base-rps", type=float, default=10.0, help="base/trough rate, req/s (total)")
    g.add_argument("--peak-rps", type=float, default=None, help="peak rate, req/s (default 4x base)")
    g.add_argument("--user-rps", type=float, default=10.0, help="pace per user before adding users")
    g.add_argument("--users-max", type=int, default=500, help="upper bound on concurrent users")
    g.add_argument("--ramp-users-per-s", type=float, default=100.0, help="users started per second")
    g.add_argument("--batch", type=int, default=1, help="batch size of each request")
    g.add_argument("--dynamic-dim", type=int, default=16, help="size used for variable (-1) dims")
    g.add_argument("--slo-models", default="", help="judge only these models (comma list)")
    g.add_argument("--slo", default="", help="override targets: resnet:p99_ms=50;bert:p99_ms=80")
    g.add_argument("--slo-warmup-s", type=float, default=0.0, help="ignore requests sent before this")
    g.add_argument("--slo-ignore", default="", help="also ignore windows START-END,... (s since start)")
    g.add_argument("--max-error-rate", type=float, default=0.01, help="allowed failed fraction")
    g.add_argument("--results-dir", default="", help="write slo.json here")


class _Settings:
    shape: shapes_mod.Shape | None = None
    weights: ClassVar[dict[str, float]] = {}
    user_rps: float = 10.0
    users_max: int = 500
    ramp: float = 100.0
    warned_cap = False
    stopping = False  # SIGINT/SIGTERM seen: the shape ends at its next tick


def _fail(msg: str) -> None:
    # a usage error: one line naming the argument and value, exit 2, no traceback
    print(f"migscale loadtest: {msg}", file=sys.stderr, flush=True)
    sys.exit(2)


@events.init.add_listener
def _on_init(environment, **_kw) -> None:
    o = environment.parsed_options
    if o is None:  # used as a library (tests build an Environment themselves)
        return
    try:
        declared = weights_from_file(o.models_yaml) if o.models_yaml else None  # every model, weight 1
        weights = parse_weights(o.models)
        if not weights and o.models_file:
            weights = weights_from_file(o.models_file)
        if not weights and declared:
            weights = dict(declared)
        if not weights:
            _fail("models: name at least one model (--models resnet:3,bert:1 or --models-yaml), got none")
        dur = float(o.run_time) if o.run_time else (0.0 if o.shape == "trace" else 60.0)
        shape = shapes_mod.shape_from_spec(o.shape, dur, o.base_rps, o.peak_rps,
                                           **shapes_mod.parse_shape_args(o.shape_args))
        windows = slo_mod.parse_windows(o.slo_ignore)
        if o.slo_warmup_s > 0:
            windows.append((0.0, float(o.slo_warmup_s)))
        only = [m.strip() for m in o.slo_models.split(",") if m.strip()] or None
        targets = slo_mod.targets_from_models(o.models_yaml or None, slo_mod.parse_slo_overrides(o.slo),
                                              only, o.max_error_rate)
    except (ValueError, OSError) as e:  # ShapeError, SloSpecError and bad weights are ValueErrors
        _fail(str(e))
        return
    except Exception as e:  # noqa: BLE001 - autoscaler.config.schema.ConfigError lists its problems
        problems = getattr(e, "problems", None)
        _fail("; ".join(problems) if problems else f"{type(e).__name__}: {e}")
        return
    problems = checks_mod.option_problems(
        set(declared) if declared is not None else None,
        models=o.models, slo=o.slo, slo_models=o.slo_models, slo_ignore=o.slo_ignore, user_rps=o.user_rps,
        warmup_s=o.slo_warmup_s, duration_s=shape.duration_s or None, max_error_rate=o.max_error_rate,
        trace_models=set(shape.points) if isinstance(shape, shapes_mod.TraceReplay) else None)
    if problems:
        _fail("; ".join(p.removeprefix("--") for p in problems))
    if o.users_max < 1:
        _fail(f"users-max: must be >= 1, got {o.users_max}")
    if o.protocol == "grpc" and _GRPC_GEVENT_ERROR is not None:
        _fail(f"protocol: grpc needs grpc.experimental.gevent ({_GRPC_GEVENT_ERROR})")
    if targets:
        # a model that is judged but never sent to would fail as "no requests measured"
        for m in targets:
            if isinstance(shape, shapes_mod.TraceReplay):
                continue
            if m not in weights:
                print(f"migscale loadtest: note: {m} has an SLO but no traffic weight; judged anyway",
                      file=sys.stderr)
    TritonModelUser.protocol = o.protocol
    TritonModelUser.batch = o.batch
    TritonModelUser.dynamic_dim = o.dynamic_dim
    _Settings.shape = shape
    _Settings.weights = weights
    _Settings.user_rps = o.user_rps
    _Settings.users_max = o.users_max
    _Settings.ramp = o.ramp_users_per_s
    PACER.weights = dict(weights)
    # Python's own SIGINT handler raises KeyboardInterrupt in whichever greenlet runs when it
    # comes: in a user's (likely on a busy machine) locust's shape join never hears of it and
    # the run goes on. Through gevent's handler the shape ends at its next tick, locust stops
    # as at the end of a run, and the verdict judges what ran (marked interrupted). SIGTERM
    # likewise: locust installs its own handler only after a shape run has ended.
    for sig in (signal.SIGINT, signal.SIGTERM):
        gevent.signal_handler(sig, _stop)
    slo_mod.install(environment, targets, windows, o.results_dir or None, planned_s=shape.duration_s)


def _stop() -> None:
    _Settings.stopping = True


class TritonModelUser(TritonUser):
    abstract = False


class ShapeDriver(LoadTestShape):
    """Users and pacing from the configured shape, re-evaluated every second."""

    # --run-time is read: it is the shape's duration (and locust's hard stop at the same time)
    use_common_options = True

    def tick(self):
        shape = _Settings.shape
        if shape is None or _Settings.stopping:
            return None
        t = self.get_run_time()
        if t >= shape.duration_s:
            return None
        rates = shapes_mod.rates_at(shape, t, _Settings.weights)
        total = sum(rates.values())
        users, per_user = shapes_mod.plan_users(total, _Settings.user_rps, _Settings.users_max)
        if per_user > _Settings.user_rps and not _Settings.warned_cap:
            _Settings.warned_cap = True
            print(f"migscale loadtest: warning: {total:.0f} req/s needs "
                  f"{math.ceil(total / _Settings.user_rps)} users at --user-rps {_Settings.user_rps}; "
                  f"capped at --users-max {users}, each user asked for {per_user:.1f} req/s",
                  file=sys.stderr, flush=True)
        PACER.weights = rates  # a model at 0 req/s this second gets nothing, whatever it had before
        PACER.per_user_rps = per_user
        return (users, _Settings.ramp)
