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
  set-based ``in``/``notin``, existence and ``!key``; field selectors only on
  the labels each kind supports (``FIELD_LABELS``);
- **update validation**: what an update may change (``update_errors``), the
  Event rules (``event_errors``), a budget's eviction policy (``pdb_errors``);
- **field audit**: which manager (the user agent's prefix before ``/``, as the
  API server names the manager of a non-apply update in ``managedFields``)
  changed which field after creation. Tests read it to prove one owner per
  field; the real API server's answer to the same question is
  ``metadata.managedFields``.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable
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


# ---------------------------------------------------------------- field selectors
#
# The API server answers a field selector only for the labels the resource
# registers (a field label conversion function per kind: pkg/apis/core/v1/
# conversion.go, pkg/apis/events/v1/conversion.go; any other kind, and a custom
# resource, gets runtime.DefaultMetaV1FieldSelectorConversion: metadata.name
# and metadata.namespace only). Any other label is 400 BadRequest. Each label
# is compared with the string the resource's ToSelectableFields gives it
# (pkg/registry/core/{pod,node,service,namespace,event}/strategy.go): a
# boolean as strconv.FormatBool, "true"/"false", a missing one "false"; a
# missing string ""; status.podIPs is accepted but not in the set, so it
# always reads "".


def _text(path: str) -> Callable[[Obj], str]:
    def get(obj: Obj) -> str:
        v = field_value(obj, path)
        return "" if v is None else ("true" if v is True else "false" if v is False else str(v))
    return get


def _flag(path: str) -> Callable[[Obj], str]:
    return lambda obj: "true" if field_value(obj, path) is True else "false"


def _pod_ip(obj: Obj) -> str:
    ips = (obj.get("status") or {}).get("podIPs") or []
    return str(ips[0].get("ip") or "") if ips else str((obj.get("status") or {}).get("podIP") or "")


def _source(component: str, controller: str) -> Callable[[Obj], str]:
    return lambda obj: _text(component)(obj) or _text(controller)(obj)


_NAME = {"metadata.name": _text("metadata.name")}
_NAMESPACED = {**_NAME, "metadata.namespace": _text("metadata.namespace")}
_REGARDING = ("kind", "namespace", "name", "uid", "apiVersion", "resourceVersion", "fieldPath")
FIELD_LABELS: dict[tuple[str, str], dict[str, Callable[[Obj], str]]] = {
    ("", "pods"): {**_NAMESPACED, "spec.nodeName": _text("spec.nodeName"),
                   "spec.restartPolicy": _text("spec.restartPolicy"), "spec.schedulerName": _text("spec.schedulerName"),
                   "spec.serviceAccountName": _text("spec.serviceAccountName"), "spec.hostNetwork": _flag("spec.hostNetwork"),
                   "status.phase": _text("status.phase"), "status.podIP": _pod_ip, "status.podIPs": lambda obj: "",
                   "status.nominatedNodeName": _text("status.nominatedNodeName"),
                   "spec.host": _text("spec.nodeName")},  # an old client's name for spec.nodeName
    ("", "nodes"): {**_NAME, "spec.unschedulable": _flag("spec.unschedulable")},
    ("", "namespaces"): {**_NAME, "status.phase": _text("status.phase")},
    ("", "services"): {**_NAMESPACED, "spec.clusterIP": _text("spec.clusterIP"), "spec.type": _text("spec.type")},
    ("", "events"): {**_NAMESPACED, **{f"involvedObject.{f}": _text(f"involvedObject.{f}") for f in _REGARDING},
                     "reason": _text("reason"), "type": _text("type"),
                     "reportingComponent": _text("reportingComponent"),
                     "source": _source("source.component", "reportingComponent")},
    ("events.k8s.io", "events"): {**_NAMESPACED, **{f"regarding.{f}": _text(f"regarding.{f}") for f in _REGARDING},
                                  "reason": _text("reason"), "type": _text("type"),
                                  "reportingController": _text("reportingController"),
                                  "source": _source("deprecatedSource.component", "reportingController")},
}


def parse_field_selector(selector: str) -> list[tuple[str, str, str]]:
    """``a=b,c!=d`` as (label, op, value) terms; ValueError (the API server's 400) for a term it cannot read."""
    terms = []
    for part in filter(None, (p.strip() for p in selector.split(","))):
        at = [(part.find(op), op) for op in ("!=", "==", "=") if op in part]
        if not at:
            raise ValueError(f"invalid selector: '{selector}'; can't understand '{part}'")
        i, op = min(at, key=lambda t: (t[0], -len(t[1])))
        terms.append((part[:i].strip(), "!=" if op == "!=" else "=", part[i + len(op):].strip()))
    return terms


def check_field_selector(res: tuple[str, str], selector: str) -> None:
    """ValueError with the API server's message for a label ``res`` does not support."""
    labels = FIELD_LABELS.get(res)
    for label, _op, _value in parse_field_selector(selector):
        if labels is None:
            if label not in ("metadata.name", "metadata.namespace"):
                raise ValueError(f'"{label}" is not a known field selector: only "metadata.name", "metadata.namespace"')
        elif label not in labels:
            raise ValueError(f"field label not supported: {label}")


def fields_match(selector: str, obj: Obj, res: tuple[str, str] | None = None) -> bool:
    labels = FIELD_LABELS.get(res) if res is not None else None
    for label, op, value in parse_field_selector(selector):
        get = (labels or {}).get(label) or _text(label)
        if (get(obj) == value) != (op == "="):
            return False
    return True


# ---------------------------------------------------------------- what an update may change
#
# The API server validates an update against the stored object (the strategy's
# ValidateUpdate) after defaulting the new one. Each problem is a field.Error:
# (cause type, field path, message), answered together as one 422 Invalid
# Status (``fakeapi.invalid``). Only the rules for the kinds migscale writes
# are here; an update's metadata.name/namespace are checked against the URL
# first (400, ``fakeapi``).

FieldError = tuple[str, str, str]  # (StatusCause reason, field, message after "<field>: ")


def _go(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def invalid(path: str, value: Any, detail: str) -> FieldError:
    return ("FieldValueInvalid", path, f"Invalid value: {_go(value)}: {detail}")


def forbidden(path: str, detail: str) -> FieldError:
    return ("FieldValueForbidden", path, f"Forbidden: {detail}")


def required(path: str, detail: str = "") -> FieldError:
    return ("FieldValueRequired", path, "Required value" + (f": {detail}" if detail else ""))


def not_supported(path: str, value: Any, supported: list[str]) -> FieldError:
    return ("FieldValueNotSupported", path,
            f"Unsupported value: {_go(value)}: supported values: {', '.join(_go(v) for v in supported)}")


def semantic(value: Any) -> Any:
    """``value`` as apiequality.Semantic.DeepEqual compares it: an absent field, a zero value and
    an empty list or map are all the same (Go decodes each to the zero value)."""
    if isinstance(value, dict):
        out = {k: semantic(v) for k, v in value.items()}
        return {k: v for k, v in out.items() if v not in (None, "", 0, False, [], {})}
    if isinstance(value, list):
        return [semantic(v) for v in value]
    return value


def _immutable(path: str, new: Any, old: Any) -> list[FieldError]:
    return [] if semantic(new) == semantic(old) else [invalid(path, new, "field is immutable")]


def metadata_update_errors(new: Obj, old: Obj) -> list[FieldError]:
    """ValidateObjectMetaUpdate: uid may not change (an empty one is filled from the stored object first)."""
    return _immutable("metadata.uid", (new.get("metadata") or {}).get("uid"), (old.get("metadata") or {}).get("uid"))


# pkg/apis/core/validation/validation.go, var updatablePodSpecFields
_POD_UPDATABLE = ("`spec.containers[*].image`,`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,"
                  "`spec.tolerations` (only additions to existing tolerations),`spec.terminationGracePeriodSeconds` "
                  "(allow it to be set to 1 if it was previously negative)")


def _term_only_adds(new: Obj, old: Obj) -> bool:
    """validateNodeSelectorTermHasOnlyAdditions: the old requirements stay, first and in order."""
    if not old.get("matchExpressions") and not old.get("matchFields"):
        return not new.get("matchExpressions") and not new.get("matchFields")
    for key in ("matchExpressions", "matchFields"):
        o, n = old.get(key) or [], new.get(key) or []
        if o and (len(n) < len(o) or semantic(n[:len(o)]) != semantic(o)):
            return False
    return True


def _node_affinity_errors(new: Obj | None, old: Obj | None) -> list[FieldError]:
    """validateNodeAffinityMutation: a gated pod's required node affinity may only be narrowed."""
    base = "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms"
    if old is None or old.get("requiredDuringSchedulingIgnoredDuringExecution") is None:
        return []  # nothing was required: anything may be
    old_terms = old["requiredDuringSchedulingIgnoredDuringExecution"].get("nodeSelectorTerms") or []
    new_terms = ((new or {}).get("requiredDuringSchedulingIgnoredDuringExecution") or {}).get("nodeSelectorTerms") or []
    if old_terms and len(old_terms) != len(new_terms):
        return [invalid(base, new_terms, "no additions/deletions to non-empty NodeSelectorTerms list are allowed")]
    return [invalid(f"{base}[{i}]", new_terms[i], "only additions are allowed (no mutations or deletions)")
            for i in range(len(old_terms)) if not _term_only_adds(new_terms[i], old_terms[i])]


def pod_update_errors(new_pod: Obj, old_pod: Obj) -> list[FieldError]:
    """ValidatePodUpdate (pkg/apis/core/validation/validation.go): a Pod's spec may change only in
    its container images, activeDeadlineSeconds (set, or lowered), added tolerations (or a changed
    tolerationSeconds), removed scheduling gates and, while the stored pod still has scheduling
    gates, added nodeSelector entries and required node affinity narrowed (the mutable scheduling
    directives); terminationGracePeriodSeconds only from a negative value to 1."""
    new, old = new_pod.get("spec") or {}, old_pod.get("spec") or {}
    errs: list[FieldError] = []
    for key in ("containers", "initContainers"):
        n, o = new.get(key) or [], old.get(key) or []
        if len(n) != len(o):
            return errs + [forbidden(f"spec.{key}", "pod updates may not add or remove containers")]
        for i, c in enumerate(n):
            image = c.get("image") or ""
            if not image:
                errs.append(required(f"spec.{key}[{i}].image"))
            if image.strip() != image:
                errs.append(invalid(f"spec.{key}[{i}].image", image, "must not have leading or trailing whitespace"))
    n_ads, o_ads = new.get("activeDeadlineSeconds"), old.get("activeDeadlineSeconds")
    if n_ads is not None:
        if not 0 <= n_ads <= 2**31 - 1:
            return errs + [invalid("spec.activeDeadlineSeconds", n_ads, "must be between 0 and 2147483647, inclusive")]
        if o_ads is not None and o_ads < n_ads:
            return errs + [invalid("spec.activeDeadlineSeconds", n_ads, "must be less than or equal to previous value")]
    elif o_ads is not None:
        errs.append(invalid("spec.activeDeadlineSeconds", None, "must not update from a positive integer to nil value"))
    for t in old.get("tolerations") or []:  # validateOnlyAddedTolerations
        if not any(semantic({**t, "tolerationSeconds": n.get("tolerationSeconds")}) == semantic(n)
                   for n in new.get("tolerations") or []):
            errs.append(forbidden("spec.tolerations", "existing toleration can not be modified except its tolerationSeconds"))
            break
    old_gates = {g.get("name") for g in old.get("schedulingGates") or []}
    for i, g in enumerate(new.get("schedulingGates") or []):  # validateOnlyDeletedSchedulingGates
        if g.get("name") not in old_gates:
            errs.append(forbidden(f"spec.schedulingGates[{i}].name",
                                  f"only deletion is allowed, but found new scheduling gate '{g.get('name')}'"))
    if semantic(new) == semantic(old):
        return errs
    munged = copy.deepcopy(new)
    for key in ("containers", "initContainers"):
        for c, o in zip(munged.get(key) or [], old.get(key) or []):
            c["image"] = o.get("image")
    for key in ("activeDeadlineSeconds", "schedulingGates", "tolerations"):
        munged[key] = copy.deepcopy(old.get(key))
    if (old.get("terminationGracePeriodSeconds") or 0) < 0 and munged.get("terminationGracePeriodSeconds") == 1:
        munged["terminationGracePeriodSeconds"] = old["terminationGracePeriodSeconds"]
    if old.get("schedulingGates"):  # the stored pod is gated: its scheduling directives may be narrowed
        if semantic(munged.get("nodeSelector")) != semantic(old.get("nodeSelector")):
            mine = munged.get("nodeSelector") or {}
            if any(mine.get(k) != v for k, v in (old.get("nodeSelector") or {}).items()):
                errs.append(invalid("spec.nodeSelector", mine,
                                    "only additions to spec.nodeSelector are allowed (no mutations or deletions)"))
            munged["nodeSelector"] = copy.deepcopy(old.get("nodeSelector"))
        old_na = (old.get("affinity") or {}).get("nodeAffinity")
        new_na = (munged.get("affinity") or {}).get("nodeAffinity")
        if semantic(old_na) != semantic(new_na):
            errs += _node_affinity_errors(new_na, old_na)
            munged["affinity"] = {**(munged.get("affinity") or {}), "nodeAffinity": copy.deepcopy(old_na)}
    if semantic(munged) != semantic(old):
        changed = sorted(k for k in set(munged) | set(old) if semantic(munged.get(k)) != semantic(old.get(k)))
        errs.append(forbidden("spec", f"pod updates may not change fields other than {_POD_UPDATABLE}\n"
                                      f"changed: {', '.join(changed)}"))
    return errs


def service_allocated(new: Obj, old: Obj) -> None:
    """What the Service storage fills in before validating an update (patchAllocatedValues,
    normalizeClusterIPs in pkg/registry/core/service/storage/storage.go): a clusterIP the client
    left out is the stored one, so a replace without it keeps the address."""
    n, o = new.setdefault("spec", {}), old.get("spec") or {}
    if "ExternalName" not in (n.get("type"), o.get("type")):
        if not n.get("clusterIP") and o.get("clusterIP"):
            n["clusterIP"] = o["clusterIP"]
        if not n.get("clusterIPs") and o.get("clusterIPs"):
            n["clusterIPs"] = list(o["clusterIPs"])
    if n.get("clusterIP") != o.get("clusterIP") and n.get("clusterIP") and n.get("clusterIPs") == o.get("clusterIPs"):
        n["clusterIPs"] = [n["clusterIP"]]


def service_update_errors(new: Obj, old: Obj) -> list[FieldError]:
    """validateUpgradeDowngradeClusterIPs: the cluster IPs may not change once set (ExternalName aside)."""
    n, o = new.get("spec") or {}, old.get("spec") or {}
    if "ExternalName" in (n.get("type"), o.get("type")):
        return []
    n_ips, o_ips = n.get("clusterIPs") or [], o.get("clusterIPs") or []
    if n_ips == ["None"] and o_ips == ["None"]:
        return []
    if len(n_ips) == len(o_ips):
        return [invalid(f"spec.clusterIPs[{i}]", n_ips, "may not change once set")
                for i, ip in enumerate(o_ips) if n_ips[i] != ip]
    if not n_ips:
        return [invalid("spec.clusterIPs[0]", n_ips, "primary clusterIP can not be unset")]
    if o_ips and n_ips[0] != o_ips[0]:
        return [invalid("spec.clusterIPs[0]", n_ips, "may not change once set")]
    return []


def update_errors(group: str, kind: str, new: Obj, old: Obj) -> list[FieldError]:
    """The strategy's ValidateUpdate for the kinds migscale writes (main resource, not status)."""
    errs = metadata_update_errors(new, old)
    if (group, kind) == ("", "Pod"):
        errs += pod_update_errors(new, old)
    elif (group, kind) in (("apps", "Deployment"), ("apps", "ReplicaSet")):
        # pkg/registry/apps/{deployment,replicaset}/strategy.go: immutable under apps/v1
        errs += _immutable("spec.selector", (new.get("spec") or {}).get("selector"), (old.get("spec") or {}).get("selector"))
    elif (group, kind) == ("", "Service"):
        errs += service_update_errors(new, old)
    return errs


def pdb_errors(pdb: Obj) -> list[FieldError]:
    """ValidatePodDisruptionBudgetSpec (pkg/apis/policy/validation/validation.go): the one rule the
    OpenAPI schema does not carry, the unhealthy pod eviction policy's values."""
    policy = (pdb.get("spec") or {}).get("unhealthyPodEvictionPolicy")
    if policy is not None and policy not in ("AlwaysAllow", "IfHealthyBudget"):
        return [not_supported("spec.unhealthyPodEvictionPolicy", policy, ["AlwaysAllow", "IfHealthyBudget"])]
    return []


# ---------------------------------------------------------------- Events
#
# pkg/apis/core/validation/events.go: every Event passes legacyValidateEvent;
# one created through events.k8s.io/v1 also the strict checks of
# ValidateEventCreate. Field paths are the core (internal) names, as the API
# server reports them: an events.k8s.io/v1 ``regarding`` is ``involvedObject``
# and its ``note`` is ``message``.

_QUALIFIED = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def _qualified_name_problems(value: str) -> list[str]:
    """validation.IsQualifiedName: an optional DNS-subdomain prefix and '/', then a name of at most 63."""
    prefix, _, name = value.rpartition("/") if "/" in value else ("", "", value)
    out = []
    if "/" in value and (not prefix or len(prefix) > 253 or not _SUBDOMAIN.match(prefix)):
        out.append("prefix part must be a lowercase RFC 1123 subdomain")
    if not name or len(name) > 63 or not _QUALIFIED.match(name):
        out.append("name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end "
                   "with an alphanumeric character, at most 63 characters")
    return out


def _series_errors(event: Obj) -> list[FieldError]:
    series = event.get("series")
    errs: list[FieldError] = []
    if series is not None:
        if (series.get("count") or 0) < 2:
            errs.append(invalid("series.count", "", "should be at least 2"))
        if not series.get("lastObservedTime"):
            errs.append(required("series.lastObservedTime"))
    return errs


# events.k8s.io/v1 name -> the core name ValidateEventUpdate reports it under
_EVENT_IMMUTABLE = {"regarding": "involvedObject", "reason": "reason", "note": "message", "type": "type",
                    "eventTime": "eventTime", "action": "action", "related": "related",
                    "reportingController": "reportingController", "reportingInstance": "reportingInstance",
                    "deprecatedSource": "source", "deprecatedFirstTimestamp": "firstTimestamp",
                    "deprecatedLastTimestamp": "lastTimestamp", "deprecatedCount": "count"}


def event_update_errors(new: Obj, old: Obj) -> list[FieldError]:
    """ValidateEventUpdate for events.k8s.io/v1: the legacy checks, a changed series, and every
    other field of the Event immutable."""
    errs = event_errors(new, events_api=True, create=False)
    if semantic(new.get("series")) != semantic(old.get("series")):
        errs += _series_errors(new)
    for v1_name, core_name in _EVENT_IMMUTABLE.items():
        errs += _immutable(core_name, new.get(v1_name), old.get(v1_name))
    return errs


def event_errors(event: Obj, *, events_api: bool, create: bool = True) -> list[FieldError]:
    """legacyValidateEvent; for an events.k8s.io/v1 create (``events_api``) also ValidateEventCreate's
    strict checks. ``events_api``: the object is in events.k8s.io/v1 shape (regarding, note)."""
    v1 = events_api
    strict = events_api and create
    ns = (event.get("metadata") or {}).get("namespace") or ""
    involved = (event.get("regarding") if v1 else event.get("involvedObject")) or {}
    controller = event.get("reportingController" if v1 else "reportingComponent") or ""
    message = event.get("note" if v1 else "message") or ""
    errs: list[FieldError] = []
    if not event.get("eventTime"):
        if not involved.get("namespace"):
            if ns not in ("", "default"):
                errs.append(invalid("involvedObject.namespace", "", "does not match event.namespace"))
        elif ns != involved["namespace"]:
            errs.append(invalid("involvedObject.namespace", involved["namespace"], "does not match event.namespace"))
    else:
        # an Event about a cluster-scoped object (a Node) lives in "default" or "kube-system";
        # one about a namespaced object is not checked against its namespace on this branch
        if not involved.get("namespace") and ns not in ("default", "kube-system"):
            errs.append(invalid("involvedObject.namespace", "", "does not match event.namespace"))
        if not controller:
            errs.append(required("reportingController"))
        errs += [invalid("reportingController", controller, p) for p in _qualified_name_problems(controller)]
        instance = event.get("reportingInstance") or ""
        if not instance:
            errs.append(required("reportingInstance"))
        if len(instance) > 128:
            errs.append(invalid("reportingInstance", "", "can have at most 128 characters"))
        action, reason = event.get("action") or "", event.get("reason") or ""
        if not action:
            errs.append(required("action"))
        if len(action) > 128:
            errs.append(invalid("action", "", "can have at most 128 characters"))
        if not reason:
            errs.append(required("reason"))
        if len(reason) > 128:
            errs.append(invalid("reason", "", "can have at most 128 characters"))
        if len(message) > 1024:
            errs.append(invalid("message", "", "can have at most 1024 characters"))
    if not _SUBDOMAIN.match(ns) or len(ns) > 253:
        errs.append(invalid("namespace", ns, "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric "
                                             "characters, '-' or '.', and must start and end with an alphanumeric character"))
    if not strict:
        return errs
    errs += _series_errors(event)
    if not event.get("eventTime"):
        errs.append(required("eventTime"))
    if event.get("type") not in ("Normal", "Warning"):
        errs.append(invalid("type", "", f"has invalid value: {event.get('type') or ''}"))
    for core_name, v1_name in (("firstTimestamp", "deprecatedFirstTimestamp"), ("lastTimestamp", "deprecatedLastTimestamp"),
                               ("count", "deprecatedCount"), ("source", "deprecatedSource")):
        if semantic(event.get(v1_name)):
            errs.append(invalid(core_name, "", "needs to be unset"))
    return errs


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
