"""What the emulated API server does to an object besides storing it: defaulting, selectors, field audit.

Used by ``fakeapi.FakeKube`` (see its docstring for the REST side). Each rule
follows the documented behaviour of kube-apiserver 1.30 (sources in
docs/kubernetes.md):

- **defaulting** runs before validation on every create and update, as the
  API server's decoders do: a Deployment gets ``replicas: 1``, the
  RollingUpdate strategy with 25%/25%, ``revisionHistoryLimit: 10`` and
  ``progressDeadlineSeconds: 600``; every pod template and Pod gets
  ``restartPolicy: Always``, ``terminationGracePeriodSeconds: 30``,
  ``dnsPolicy: ClusterFirst``, ``schedulerName: default-scheduler``, each
  container ``imagePullPolicy`` (``Always`` for ``:latest`` or no tag, else
  ``IfNotPresent``) and ``terminationMessagePath/Policy``, each port
  ``protocol: TCP``; a Service gets ``type: ClusterIP``, a ``clusterIP``,
  ``sessionAffinity: None`` and ``targetPort = port``; an HPA
  ``minReplicas: 1``. A client that compares what it sent with what it reads
  back must therefore compare a subset, or it rewrites forever;
- **label and field selectors** for list and watch: equality, ``!=``,
  set-based ``in``/``notin``, existence and ``!key``;
- **field audit**: which manager (the user agent's prefix before ``/``, as the
  API server names the manager of a non-apply update in ``managedFields``)
  changed which field after creation. Tests read it to prove one owner per
  field; the real API server's answer to the same question is
  ``metadata.managedFields``.
"""

from __future__ import annotations

import copy
import re
from typing import Any

Obj = dict[str, Any]


# ---------------------------------------------------------------- defaulting


def _default_container(c: Obj) -> None:
    image = str(c.get("image") or "")
    tag = image.rsplit("/", 1)[-1]
    latest = "@" not in tag and (":" not in tag or tag.endswith(":latest"))
    c.setdefault("imagePullPolicy", "Always" if latest else "IfNotPresent")
    c.setdefault("terminationMessagePath", "/dev/termination-log")
    c.setdefault("terminationMessagePolicy", "File")
    c.setdefault("resources", {})
    for p in c.get("ports") or []:
        p.setdefault("protocol", "TCP")
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        pr = c.get(probe)
        if isinstance(pr, dict):
            pr.setdefault("timeoutSeconds", 1)
            pr.setdefault("periodSeconds", 10)
            pr.setdefault("successThreshold", 1)
            pr.setdefault("failureThreshold", 3)
            if isinstance(pr.get("httpGet"), dict):
                pr["httpGet"].setdefault("scheme", "HTTP")


def default_pod_spec(spec: Obj) -> None:
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("dnsPolicy", "ClusterFirst")
    spec.setdefault("schedulerName", "default-scheduler")
    spec.setdefault("securityContext", {})
    for c in spec.get("containers") or []:
        _default_container(c)
    for c in spec.get("initContainers") or []:
        _default_container(c)


def apply_defaults(obj: Obj, cluster_ips: list[int]) -> None:
    """Fill the server-side defaults of ``obj`` in place (built-in kinds only)."""
    kind = obj.get("kind")
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return
    if kind in ("Deployment", "ReplicaSet"):
        spec.setdefault("replicas", 1)
        spec.setdefault("revisionHistoryLimit", 10)
        if kind == "Deployment":
            spec.setdefault("progressDeadlineSeconds", 600)
            strategy = spec.setdefault("strategy", {"type": "RollingUpdate"})
            if strategy.get("type", "RollingUpdate") == "RollingUpdate":
                strategy.setdefault("type", "RollingUpdate")
                ru = strategy.setdefault("rollingUpdate", {})
                ru.setdefault("maxSurge", "25%")
                ru.setdefault("maxUnavailable", "25%")
        tpl = spec.get("template") or {}
        if isinstance(tpl.get("spec"), dict):
            default_pod_spec(tpl["spec"])
    elif kind == "Pod":
        default_pod_spec(spec)
    elif kind == "Service":
        spec.setdefault("type", "ClusterIP")
        spec.setdefault("sessionAffinity", "None")
        if "clusterIP" not in spec:
            cluster_ips[0] += 1
            n = cluster_ips[0]
            spec["clusterIP"] = f"10.96.{n // 250}.{n % 250 + 1}"
            spec["clusterIPs"] = [spec["clusterIP"]]
        for p in spec.get("ports") or []:
            p.setdefault("protocol", "TCP")
            p.setdefault("targetPort", p.get("port"))
    elif kind == "HorizontalPodAutoscaler":
        spec.setdefault("minReplicas", 1)


# ---------------------------------------------------------------- selectors


def _split_selector(selector: str) -> list[str]:
    parts, depth, cur = [], 0, ""
    for ch in selector:
        depth += ch == "("
        depth -= ch == ")"
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    return [p.strip() for p in parts if p.strip()]


def selector_matches(selector: str, lbls: dict[str, str]) -> bool:
    for raw in _split_selector(selector):
        m = re.match(r"^(\S+)\s+(in|notin)\s+\((.*)\)$", raw)
        if m:
            key, op, vals = m.group(1), m.group(2), {v.strip() for v in m.group(3).split(",")}
            if (op == "in") != (lbls.get(key) in vals):
                return False
        elif "!=" in raw:
            key, val = raw.split("!=", 1)
            if lbls.get(key.strip()) == val.strip():
                return False
        elif "=" in raw:
            key, val = raw.replace("==", "=").split("=", 1)
            if lbls.get(key.strip()) != val.strip():
                return False
        elif raw.startswith("!"):
            if raw[1:] in lbls:
                return False
        elif raw not in lbls:
            return False
    return True


def match_labels_selector(sel: Obj | None) -> str:
    """A LabelSelector object (matchLabels + matchExpressions) as a selector string."""
    sel = sel or {}
    parts = [f"{k}={v}" for k, v in sorted((sel.get("matchLabels") or {}).items())]
    for e in sel.get("matchExpressions") or []:
        op, key, vals = e.get("operator"), e.get("key"), e.get("values") or []
        if op in ("In", "NotIn"):
            parts.append(f"{key} {op.lower()} ({','.join(vals)})")
        elif op == "Exists":
            parts.append(key)
        elif op == "DoesNotExist":
            parts.append(f"!{key}")
    return ",".join(parts)


def field_value(obj: Obj, path: str) -> Any:
    cur: Any = obj
    for part in path.split("."):
        cur = cur.get(part) if isinstance(cur, dict) else None
    return cur


def fields_match(selector: str, obj: Obj) -> bool:
    for cond in filter(None, selector.split(",")):
        if "!=" in cond:
            fld, val = cond.split("!=", 1)
            if str(field_value(obj, fld) or "") == val:
                return False
        else:
            fld, _, val = cond.replace("==", "=").partition("=")
            if str(field_value(obj, fld) or "") != val:
                return False
    return True


# ---------------------------------------------------------------- field audit


def manager_of(user_agent: str) -> str:
    """``migscale/ctl-1`` -> ``migscale``: the API server's default field manager of an update."""
    return (user_agent or "unknown").split("/", 1)[0] or "unknown"


def _leaves(prefix: str, value: Any, out: dict[str, Any], depth: int) -> None:
    if isinstance(value, dict) and depth > 0:
        for k, v in value.items():
            _leaves(f"{prefix}.{k}", v, out, depth - 1)
    else:
        out[prefix] = value


def changed_fields(old: Obj | None, new: Obj | None) -> set[str]:
    """Paths that differ: each ``spec`` field (two levels), each label and annotation, and ``status``."""
    def flat(o: Obj | None) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if not o:
            return out
        _leaves("spec", o.get("spec") or {}, out, 2)
        meta = o.get("metadata") or {}
        for part in ("labels", "annotations"):
            for k, v in (meta.get(part) or {}).items():
                out[f"metadata.{part}.{k}"] = v
        if o.get("status") is not None:
            out["status"] = o.get("status")
        return out

    a, b = flat(old), flat(new)
    return {k for k in set(a) | set(b) if a.get(k) != b.get(k)}


def copy_obj(obj: Obj) -> Obj:
    return copy.deepcopy(obj)
