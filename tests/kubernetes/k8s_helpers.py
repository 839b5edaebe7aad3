"""Shared builders for the Kubernetes backend tests."""

from __future__ import annotations

from autoscaler.act.kubernetes.render import RenderConfig
from autoscaler.policy.types import Cost, ModelSpec, Plan

NS = "default"
RESNET = ModelSpec(
    "resnet", {"1g.10gb": 58, "2g.20gb": 113}, ("1g.10gb", "2g.20gb"), min_replicas=1, max_replicas=8
)
LLM = ModelSpec(
    "llm", {}, (), backend="multinode", nodes_per_group=2, gpus_per_node=1, fabric="ib-a", max_replicas=2
)
CFG = RenderConfig(namespace=NS)


def plan(desired: dict[tuple[str, str], int]) -> Plan:
    return Plan(
        t_s=0.0,
        desired=desired,
        assignments=(),
        layouts={},
        actions=(),
        shortfall={},
        cost=Cost(),
        reasons={},
    )


def gpu_node(name: str, counts: dict[str, int], *, config: str | None = "all-3g.40gb", gpus: int = 1) -> dict:
    labels = {
        "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB",
        "nvidia.com/gpu.count": str(gpus),
        "nvidia.com/mig.strategy": "mixed",
        "nvidia.com/mig.config.state": "success",
    }
    if config:
        labels["nvidia.com/mig.config"] = config
    # the device plugin and GFD write a profile's "+" as "." (not allowed in a resource name or label key)
    labels.update({f"nvidia.com/mig-{p.replace('+', '.')}.count": str(n) for p, n in counts.items()})
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels},
        "spec": {},
        "status": {"allocatable": {f"nvidia.com/mig-{p.replace('+', '.')}": str(n) for p, n in counts.items()}},
    }


def pod(
    name: str,
    node: str,
    *,
    model: str | None = "resnet",
    profile: str = "3g.40gb",
    ready: bool = True,
    owned: bool = True,
    ns: str = NS,
) -> dict:
    labels = {"migscale.io/model": model, "migscale.io/profile": profile} if model else {}
    if owned:
        labels["app.kubernetes.io/managed-by"] = "migscale"
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "labels": labels},
        "spec": {
            "nodeName": node,
            "containers": [
                {"name": "triton", "image": "x",
                 "resources": {"limits": {f"nvidia.com/mig-{profile.replace('+', '.')}": "1"}}}
            ],
        },
        "status": {
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def caught_up(be, fake, timeout_s: float = 5.0) -> None:
    """Wait until every informer of ``be`` has seen the emulated server's latest resourceVersion.

    The emulated server's versions are one global integer (a test-only assumption: real
    resourceVersions are opaque) and it sends bookmarks every 0.1 s in these fixtures.
    """
    import time

    target = fake.resource_version
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if all(i.absent or int(i.resource_version or 0) >= target for i in be.caches.all()):
            return
        time.sleep(0.02)
    raise AssertionError(f"informers behind {target}: {[(i.kind, i.resource_version) for i in be.caches.all()]}")


# The fake API server's controllers run on real threads. In the parallel pass on
# two busy cores they fall behind: a 10 s wait for a replacement pod ran out
# there once while the same test passes alone. The bound only decides how long a
# failing test waits, so a wait allows this many times the bound its caller names.
WAIT_SLACK = 3.0


def wait_until(cond, timeout_s: float = 10.0, what: str = "condition"):
    import time

    limit = timeout_s * WAIT_SLACK
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        got = cond()
        if got:
            return got
        time.sleep(0.02)
    raise AssertionError(f"timed out after {limit:g}s waiting for {what}")


def act(kind, model=None, profile="1g.10gb", gpu="node-0/0", replica=None, reason=None, layout=None):
    from autoscaler.policy.types import Action, ActionKind, Reason

    return Action(ActionKind(kind), reason or Reason.SCALE_UP_DEMAND, gpu=gpu, model=model, profile=profile,
                  replica=replica, layout=layout)
