"""An emulated HorizontalPodAutoscaler controller that reads migscale's metrics API over HTTP.

The upstream controller's loop (docs/kubernetes.md), every ``sync_s``
(15 s upstream, scaled down in tests), for each ``autoscaling/v2`` HPA:

1. read the target's scale (``spec.replicas``; 0 means scaling is disabled)
   and the pods its selector matches;
2. per metric, a proposal: ``Pods`` -- GET
   ``/apis/custom.metrics.k8s.io/v1beta2/namespaces/NS/pods/*/METRIC?labelSelector=…``
   and the plain-metric calculation with the missing-pod rules (pods not
   Running/Ready are left out, as the controller does for non-CPU metrics);
   ``External`` -- GET ``/apis/external.metrics.k8s.io/v1beta1/namespaces/NS/METRIC``,
   sum the values, ``AverageValue``: ``ceil(sum / target)`` unless within the
   tolerance of the current count, ``Value``: ``ceil(current * sum / target)``;
   ``Object`` -- the described object's value against the target;
3. the largest proposal; a metric that cannot be read is skipped, and none
   readable means no scaling (``ScalingActive=False``);
4. stabilization window and ``behavior`` policies, then min/max -- the same
   stages ``autoscaler.policy.hpa`` reproduces, reused here;
5. write the target's scale subresource under the manager name
   ``horizontal-pod-autoscaler``, an Event ``SuccessfulRescale``, and status.

The metrics server is migscale's own API (plain HTTP in tests; through the
aggregation layer in a cluster).
"""

from __future__ import annotations

import math
from typing import Any
from urllib.parse import quote

import httpx
from fakeapi import ApiError, FakeKube, iso
from fakesem import copy_obj, match_labels_selector, selector_matches

from autoscaler.api.quantity import parse_quantity
from autoscaler.policy import hpa as algo

Obj = dict[str, Any]
MANAGER = "horizontal-pod-autoscaler"


def _rules(b: Obj | None, default: algo.ScalingRules) -> algo.ScalingRules:
    if not b:
        return default
    pols = tuple(algo.ScalingPolicy(algo.PolicyType(p["type"]), int(p["value"]), float(p["periodSeconds"]))
                 for p in b.get("policies") or []) or default.policies
    return algo.ScalingRules(float(b.get("stabilizationWindowSeconds", default.stabilization_window_s)),
                             algo.SelectPolicy(b.get("selectPolicy", "Max")), pols)


class HpaController:
    def __init__(self, fake: FakeKube, metrics_url: str, *, sync_s: float = 15.0, tolerance: float = 0.1) -> None:
        self.fake = fake
        self.metrics_url = metrics_url.rstrip("/")
        self.sync_s = sync_s
        self.tolerance = tolerance
        self.http = httpx.Client(timeout=5)
        self._last: dict[str, float] = {}
        self._history: dict[str, tuple[algo.Recommendation, ...]] = {}
        self._events: dict[str, tuple[algo.ScaleEvent, ...]] = {}
        self.scales: list[tuple[float, str, int, int]] = []  # (t, hpa, before, after)
        self.errors: list[str] = []

    def close(self) -> None:
        self.http.close()

    def _get(self, path: str) -> Obj | None:
        try:
            r = self.http.get(self.metrics_url + path)
        except httpx.HTTPError as exc:
            self.errors.append(f"{path}: {exc}")
            return None
        return r.json() if r.status_code == 200 else None

    def _proposal(self, m: Obj, ns: str, current: int, pods: list[Obj], sel: str) -> int | None:
        kind = m.get("type")
        if kind == "Pods":
            spec = m["pods"]
            got = self._get(f"/apis/custom.metrics.k8s.io/v1beta2/namespaces/{ns}/pods/*/{spec['metric']['name']}"
                            f"?labelSelector={quote(sel)}")
            if got is None:
                return None
            values = {i["describedObject"]["name"]: float(parse_quantity(i["value"])) for i in got.get("items") or []}
            counted = [p for p in pods if (p.get("status") or {}).get("phase") == "Running"
                       and not p["metadata"].get("deletionTimestamp")]
            per_pod = [values.get(p["metadata"]["name"]) for p in counted]
            if not any(v is not None for v in per_pod):
                return None
            target = float(parse_quantity(spec["target"]["averageValue"]))
            return algo.pods_metric_replicas(current, per_pod, target, self.tolerance)[0]
        if kind == "External":
            spec = m["external"]
            msel = match_labels_selector((spec["metric"].get("selector")) or {})
            got = self._get(f"/apis/external.metrics.k8s.io/v1beta1/namespaces/{ns}/{spec['metric']['name']}"
                            + (f"?labelSelector={quote(msel)}" if msel else ""))
            if not got or not got.get("items"):
                return None
            total = sum(float(parse_quantity(i["value"])) for i in got["items"])
            tgt = spec["target"]
            if tgt.get("type") == "AverageValue":
                target = float(parse_quantity(tgt["averageValue"]))
                if abs(1 - total / (target * current)) <= self.tolerance:
                    return current
                return math.ceil(total / target)
            return algo.replica_ratio(current, total, float(parse_quantity(tgt["value"])), self.tolerance)[0]
        if kind == "Object":
            spec = m["object"]
            ref = spec["describedObject"]
            res = {"Deployment": "deployments.apps", "LeaderWorkerSet": "leaderworkersets.leaderworkerset.x-k8s.io"}.get(ref["kind"])
            got = self._get(f"/apis/custom.metrics.k8s.io/v1beta2/namespaces/{ns}/{res}/{ref['name']}/{spec['metric']['name']}")
            if not got:
                return None
            value = float(parse_quantity(got["value"]))
            tgt = spec["target"]
            if tgt.get("type") == "AverageValue":
                return math.ceil(value / float(parse_quantity(tgt["averageValue"])))
            return algo.replica_ratio(current, value, float(parse_quantity(tgt["value"])), self.tolerance)[0]
        return None

    def step(self, now: float) -> None:
        for h in self.fake.view("HorizontalPodAutoscaler", "autoscaling"):
            key = f"{h['metadata']['namespace']}/{h['metadata']['name']}"
            if now - self._last.get(key, -1e18) < self.sync_s:
                continue
            self._last[key] = now
            try:
                self._sync(h, key, now)
            except ApiError as exc:
                self.errors.append(f"{key}: {exc}")

    def _sync(self, h: Obj, key: str, now: float) -> None:
        ns, spec = h["metadata"]["namespace"], h["spec"]
        ref = spec["scaleTargetRef"]
        group = ref["apiVersion"].rpartition("/")[0]
        target = self.fake.get(ref["kind"], ref["name"], ns)
        if target is None or group not in ("apps", "leaderworkerset.x-k8s.io"):
            return
        current = int(target["spec"].get("replicas", 1))
        if current == 0:
            return  # scaling disabled while the target is at 0
        sel = match_labels_selector(target["spec"].get("selector"))
        pods = [p for p in self.fake.view("Pod") if p["metadata"].get("namespace") == ns
                and selector_matches(sel, p["metadata"].get("labels") or {})]
        props = [p for m in spec.get("metrics") or [] if (p := self._proposal(m, ns, current, pods, sel)) is not None]
        lo, hi = int(spec.get("minReplicas", 1)), int(spec["maxReplicas"])
        if not props:
            self._status(h, current, current, "ScalingActive", "False", "FailedGetExternalMetric", now)
            return
        desired = max(props)
        behavior = spec.get("behavior") or {}
        up = _rules(behavior.get("scaleUp"), algo.DEFAULT_SCALE_UP)
        down = _rules(behavior.get("scaleDown"), algo.DEFAULT_SCALE_DOWN)
        hist = self._history.get(key, ())
        stable, _ = algo.stabilize(current, desired, hist, now, up.stabilization_window_s, down.stabilization_window_s)
        keep = max(up.stabilization_window_s, down.stabilization_window_s, algo.longest_period_s(up, down))
        self._history[key] = tuple(r for r in hist if r.t_s > now - keep) + (algo.Recommendation(now, desired),)
        events = self._events.get(key, ())
        new, _ = algo.apply_behavior(current, stable, lo, hi, events, up, down, now)
        new, _ = algo.clamp(new, lo, hi)
        if new != current:
            obj = copy_obj(target)
            obj["spec"]["replicas"] = new
            self.fake.update_obj(obj, MANAGER, check_rv=False, validate=False)
            self._events[key] = algo.record_scale_event(events, now, current, new, keep)
            self.scales.append((now, key, current, new))
            self.fake.create_obj({"apiVersion": "events.k8s.io/v1", "kind": "Event",
                                  "metadata": {"name": f"{h['metadata']['name']}.{len(self.scales)}", "namespace": ns},
                                  "eventTime": iso(now).replace("Z", ".000000Z"), "reportingController": MANAGER,
                                  "reportingInstance": MANAGER, "action": "Scale", "reason": "SuccessfulRescale",
                                  "note": f"New size: {new}; reason: metric above or below target", "type": "Normal",
                                  "regarding": {"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
                                                "name": h["metadata"]["name"], "namespace": ns}},
                                 MANAGER, validate=False)
        self._status(h, current, new, "ScalingActive", "True", "ValidMetricFound", now)

    def _status(self, h: Obj, current: int, desired: int, ctype: str, status: str, reason: str, now: float) -> None:
        st = {"currentReplicas": current, "desiredReplicas": desired,
              "conditions": [{"type": ctype, "status": status, "reason": reason, "lastTransitionTime": iso(now)}]}
        if desired != current:
            st["lastScaleTime"] = iso(now)
        if (h.get("status") or {}).get("desiredReplicas") != desired or (h.get("status") or {}).get("conditions", [{}])[0].get("status") != status:
            new = copy_obj(h)
            new["status"] = st
            try:
                self.fake.update_obj(new, MANAGER, sub="status", check_rv=False, validate=False)
            except ApiError:
                pass
