"""Workers that stay: on a standing cluster a run's worker actors are kept after it (detached, in the farm's
namespace) and leased by the next run built the same way, instead of a new process per run.

A kept worker is named by its *key* and its node: ``kept:<key>:<node id>:<suffix>``. The key is a hash of what
makes a worker process behave as it does, beyond what each lease rebinds:

- the component sections its rollouts are composed from (``model``, ``agent``, ``environment``, ``runtime``,
  ``verifier``, ``profiles``, ``serve``, ``images``: ``cluster.assembly.backend_choice.WORKER_SECTIONS``),
- the code: the project's directory, the Python and Ray versions; and the worker itself refuses a lease once the
  file of a module it imported (the project's, a user's module a config names, an installed package's) changed on
  disk (``changed_code``: it would run other code than a new process would) and exits, so the run starts a new one,
- the job's runtime environment (its ``env_vars``, ``working_dir``, ``py_modules``, ...), which the actor inherits;
  environment variables reach a worker only that way or from its node's raylet, which the node fixes.

The run's id, directory, dataset, ``run``/``output``/``farm`` options and the model's URL are not part of it: a lease
rebinds them (``NodeWorker.lease``), along with the composer itself, a fresh mailbox, the live rows, the metrics'
run tag, the image and file transfer, the containers' note scope, the pause gate and policy version.

A lease belongs to one run (``holder``) and lasts ``LEASE_TTL`` seconds unless renewed; the driver renews every
``RENEW_INTERVAL`` seconds and releases at its end. A run that finds every kept worker of its key leased starts its
own. A driver that dies stops renewing: its lease expires, the worker cancels what it ran for it, removes its
containers, and is free again. A worker idle (no lease) for ``idle`` seconds exits; ``rollout dev-cluster down``
and stopping the cluster end it with every other process of the cluster.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import sys
import uuid
from dataclasses import dataclass, field
from typing import Any

import ray

from cluster.session.connect import PROJECT_ROOT

KEPT_NAMESPACE = "rollout-farm"
"""The Ray namespace kept workers live in (named, detached)."""
KEPT_PREFIX = "kept:"
LEASE_TTL = 30.0
"""Seconds a lease lasts unless its run renews it: how long a dead driver's workers stay unavailable."""
RENEW_INTERVAL = 5.0
"""Seconds between a run's renewals of its leases."""


@dataclass
class KeepWorkers:
    """A run's kept-worker settings: how long an idle worker waits, and what its workers are built from."""

    idle: float
    """Seconds a worker kept after the run waits for another before it exits."""
    parts: dict[str, Any] = field(default_factory=dict)
    """The component sections the workers compose from (JSON), hashed into the key with the code and environment."""
    ttl: float = LEASE_TTL
    """Seconds a lease lasts without a renewal."""

    def key(self) -> str:
        """The hash a kept worker's name carries (call once joined: it reads the job's runtime environment)."""
        return worker_key(self.parts)


def worker_key(parts: dict[str, Any]) -> str:
    runtime_env = ray.get_runtime_context().runtime_env
    made_of = {"parts": parts, "project": PROJECT_ROOT, "python": platform.python_version(), "ray": ray.__version__,
               "runtime_env": dict(runtime_env or {})}
    text = json.dumps(made_of, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def loaded_code(known: dict[str, tuple[int, int]] | None = None) -> dict[str, tuple[int, int]]:
    """``{file: (mtime_ns, size)}`` of every module this process imported from a file: the project's, a user's
    module a config names, the installed packages (``known`` kept as it is: what a module's file was when it was
    first seen). A few thousand ``stat`` calls: milliseconds."""
    seen = dict(known or {})
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None)  # a module object's optional attribute, not a seam
        if not path or path in seen:
            continue
        try:
            stat = os.stat(path)
        except OSError:
            continue
        seen[path] = (stat.st_mtime_ns, stat.st_size)
    return seen


def changed_code(known: dict[str, tuple[int, int]]) -> list[str]:
    """The files of ``known`` that changed or went since (a worker that imported them runs code that is no longer
    the project's: it takes no other run)."""
    changed = []
    for path, (mtime, size) in known.items():
        try:
            stat = os.stat(path)
        except OSError:
            changed.append(path)
            continue
        if (stat.st_mtime_ns, stat.st_size) != (mtime, size):
            changed.append(path)
    return sorted(changed)


def kept_prefix(key: str, node_id: str) -> str:
    return f"{KEPT_PREFIX}{key}:{node_id}:"


def kept_name(key: str, node_id: str) -> str:
    """A new kept worker's name (a suffix of its own: two runs may each start one for the same key and node)."""
    return kept_prefix(key, node_id) + uuid.uuid4().hex[:8]


def kept_names(key: str) -> list[str]:
    """The names of the live kept workers of ``key``, on any node (a GCS call: call it on a thread)."""
    prefix = f"{KEPT_PREFIX}{key}:"
    return sorted(entry["name"] for entry in ray.util.list_named_actors(all_namespaces=True)
                  if entry.get("namespace") == KEPT_NAMESPACE and entry["name"].startswith(prefix))


def kept_handle(name: str) -> Any | None:
    try:
        return ray.get_actor(name, namespace=KEPT_NAMESPACE)
    except ValueError:  # it exited since it was listed
        return None


def new_holder(run_id: str) -> str:
    """A lease holder's id: this run in this driver process, unique."""
    return f"{run_id}:{uuid.uuid4().hex[:12]}"
