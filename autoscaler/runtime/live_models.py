"""Live model changes on a running local cluster: ``migscale apply`` hands a file over, the controller picks it up.

Place in the loop: between two ticks. ``migscale apply models.yaml``
(``submit``) validates the file as ``migscale up`` does -- alone, against the
running controller's cluster.yaml, and its model directories -- and writes
the validated *document* (not a path to a file that may change afterwards)
into the run directory as ``models.applied.json`` with the next generation
number. The file is written to a temporary name and renamed over the old one
(``os.replace``), so a reader sees the previous document or the new one,
never half of one; a lock file serialises two ``apply`` runs, so a
generation is never handed out twice.

The running controller (``LiveModels.poll``, called from the run loop's 1 s
idle hook, on the driver's thread and so never in the middle of a tick)
reads the file when its generation is newer than the one in force, checks
it again (a model directory may have gone since), and swaps the model set:

- the loop's specs and SLOs: a changed SLO is in force at the next tick;
- a new model's runtime joins the cluster, and the next tick's planner
  places its ``min_replicas``;
- a removed model leaves the specs, so the next tick's planner drains and
  deletes its replicas (replicas of a model no longer declared go); its
  runtime (route, restarts) stays until its last replica is gone.

A model that stays may change its SLO, replica bounds, profiles and
capacities, but not what its replicas run: its model directory (as
resolved), its backend or its group size. The front door routes a model to
one Triton model name, and replicas already running keep the directory they
started from, so taking such a change would route requests to servers that
do not have the model, or serve two versions behind one name. It is refused
with the way to do it (remove the model, then add it back, or restart ``up``);
so is adding back a removed model whose last replicas are still draining
from another directory. A model with no replica at all may change anything.

A document that fails the second check is refused: the config in force
stays, and ``status.json`` says why (``config.error``). ``migscale status``
shows the generation in force (``config.generation``; 1 is the file ``up``
started with).
"""

from __future__ import annotations

import fcntl
import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from autoscaler.act.local.cluster import LocalCluster
from autoscaler.act.local.pids import write_json_atomic
from autoscaler.act.local.replicas import ModelRuntime
from autoscaler.config import ClusterConfig, ConfigError, ModelsConfig, model_specs, validate_pair
from autoscaler.config.io import load_yaml
from autoscaler.config.schema import parse_models
from autoscaler.runtime.local import LocalController
from autoscaler.runtime.local_setup import SetupError, model_runtimes

APPLIED = "models.applied.json"
LOCK = "models.applied.lock"
log = logging.getLogger("migscale.live")


@dataclass(frozen=True)
class Change:
    generation: int
    added: tuple[str, ...]
    removed: tuple[str, ...]
    changed: tuple[str, ...]

    def summary(self) -> str:
        parts = [f"+{n}" for n in self.added] + [f"-{n}" for n in self.removed] + [f"~{n}" for n in self.changed]
        return f"generation {self.generation}: " + (", ".join(parts) if parts else "no model changed")


def _as_run(cfg: ModelsConfig) -> dict:
    """Each model with its directory resolved: the same directory named from another folder is no change."""
    return {m.name: m.model_copy(update={"model_dir": str(cfg.resolve(m.model_dir).resolve())})
            for m in cfg.models}


def diff(old: ModelsConfig | None, new: ModelsConfig, generation: int) -> Change:
    before = _as_run(old) if old is not None else {}
    after = _as_run(new)
    return Change(
        generation,
        tuple(n for n in after if n not in before),
        tuple(n for n in before if n not in after),
        tuple(n for n in after if n in before and after[n] != before[n]),
    )


def models_from_document(doc: Any, base_dir: Path, where: str) -> ModelsConfig:
    """A validated ``ModelsConfig`` from a parsed models.yaml; relative paths resolve against ``base_dir``."""
    try:
        return parse_models(doc, base_dir)
    except ConfigError as exc:
        raise ConfigError([f"{where}: {p}" for p in exc.problems]) from None


def check(models: ModelsConfig, cluster: ClusterConfig, where: str) -> tuple[list[str], dict[str, ModelRuntime]]:
    """(what ``migscale up`` would refuse about ``models`` on this cluster, the runtimes
    they resolve to): the pair, then the model dirs; no runtimes when either is refused."""
    problems = [f"{where}: {p}" for p in validate_pair(models, cluster)]
    if problems:
        return problems, {}
    try:
        return [], model_runtimes(models)
    except SetupError as exc:
        return [f"{where}: {exc}"], {}


def runtime_changes(running: Mapping[str, ModelRuntime], models: ModelsConfig,
                    new: Mapping[str, ModelRuntime]) -> list[str]:
    """Why ``models`` (resolving to ``new``) cannot be taken live: each model that keeps its
    name but would run something else than its replicas run now (``running``: the runtimes
    of the models that have a replica, removed models still draining included)."""
    out = []
    for i, m in enumerate(models.models):
        old, now = running.get(m.name), new[m.name]
        if old is None or old == now:
            continue
        if old.backend != now.backend:
            field, was, got = "backend", old.backend, now.backend
        elif old.group_size != now.group_size:
            field, was, got = "multinode", f"groups of {old.group_size}", f"groups of {now.group_size}"
        else:
            field, was, got = "model_dir", str(old.repository / old.triton_name), str(now.repository / now.triton_name)
        out.append(f"models[{i}].{field}: {m.name} runs {was}, which cannot change while its replicas run "
                   f"(remove {m.name}, apply, wait for its replicas to go, then add it back; or restart "
                   f"`migscale up`), got {got}")
    return out


def current_generation(run_dir: Path) -> int:
    """The newest generation handed over or in force (1: the file ``up`` started with)."""
    gens = [1]
    for name, path in ((APPLIED, ("generation",)), ("status.json", ("config", "generation"))):
        try:
            value: Any = json.loads((run_dir / name).read_text())
            for k in path:
                value = value[k]
            gens.append(int(value))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return max(gens)


def submit(run_dir: Path, models_path: Path, cluster: ClusterConfig) -> int:
    """Validate ``models_path`` and hand it to the controller of ``run_dir`` (its generation is returned);
    raise ConfigError, handing nothing over, if it is invalid."""
    doc = load_yaml(models_path)  # ConfigError on unreadable or malformed YAML, naming the file
    models = models_from_document(doc, models_path.resolve().parent, str(models_path))
    problems, _ = check(models, cluster, str(models_path))
    if problems:
        raise ConfigError(problems)
    with open(run_dir / LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two applies at once get distinct generations
        generation = current_generation(run_dir) + 1
        write_json_atomic(run_dir / APPLIED, {
            "generation": generation,
            "source": str(models_path.resolve()),
            "base_dir": str(models_path.resolve().parent),
            "models": doc,
        })
    return generation


class LiveModels:
    """The controller's side: picks up a newer applied document and swaps the model set."""

    def __init__(self, ctl: LocalController, cluster: LocalCluster, say: Callable[[str], None] = print) -> None:
        self.ctl = ctl
        self.cluster = cluster
        self.say = say
        self.generation = 1
        self.error: str | None = None  # why the newest generation was refused
        self.refused = 0
        self.last_change: Change | None = None
        self.path = cluster.run_dir / APPLIED
        self.path.unlink(missing_ok=True)  # a new `up` starts from its own file, generation 1

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {"generation": self.generation, "models": [m.name for m in self.ctl.models_cfg.models]}
        if self.last_change is not None:
            out["change"] = self.last_change.summary()
        if self.error:
            out["error"] = self.error
            out["refused_generation"] = self.refused
        return out

    def poll(self) -> Change | None:
        """Take a newer applied generation into force; None when there is none (or it was refused)."""
        self.retire()
        try:
            data = json.loads(self.path.read_text())
            generation = int(data["generation"])
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            self.error = f"{self.path}: unreadable: {exc}"
            return None
        if generation <= max(self.generation, self.refused):
            return None
        where = str(data.get("source") or self.path)
        try:
            models = models_from_document(data.get("models"), Path(str(data.get("base_dir") or ".")), where)
            problems, runtimes = check(models, self.ctl.cluster_cfg, where)
            if not problems:
                with self.cluster._lock:  # a model with no replica left may change anything
                    serving = {r.model for r in self.cluster.replicas()}
                    running = {n: rt for n, rt in self.cluster.models.items() if n in serving}
                problems = [f"{where}: {p}" for p in runtime_changes(running, models, runtimes)]
            if problems:
                raise ConfigError(problems)
        except ConfigError as exc:
            self.refused, self.error = generation, "; ".join(exc.problems)
            self.say(f"config generation {generation} refused, generation {self.generation} stays: {self.error}")
            return None
        change = self.swap(models, generation, runtimes)
        self.retire()
        self.say(f"config {change.summary()}")
        return change

    def swap(self, models: ModelsConfig, generation: int, runtimes: Mapping[str, ModelRuntime]) -> Change:
        """Put ``models`` (checked, resolving to ``runtimes``) in force as ``generation``."""
        ctl = self.ctl
        change = diff(ctl.models_cfg, models, generation)
        specs = model_specs(models, ctl.cluster_cfg)
        slo = {m.name: float(m.slo.p99_ms) for m in models.models}
        ctl.models_cfg, ctl.specs, ctl.slo_p99_ms = models, specs, slo
        ctl.policy = replace(ctl.policy, models=tuple(specs), slo_p99_ms=slo)
        if ctl.loop is not None:
            ctl.loop.config = ctl.policy
        with self.cluster._lock:
            self.cluster.models.update(runtimes)  # new models (runtime_changes refused any other); removed ones retire later
            self.cluster.declared = frozenset(m.name for m in models.models)  # a removed model is never held
        self.generation, self.error, self.refused, self.last_change = generation, None, 0, change
        return change

    def retire(self) -> None:
        """Forget the runtime of a removed model once its last replica is gone."""
        declared = {m.name for m in self.ctl.models_cfg.models}
        with self.cluster._lock:
            serving = {r.model for r in self.cluster.replicas()}
            for name in [n for n in self.cluster.models if n not in declared and n not in serving]:
                del self.cluster.models[name]
