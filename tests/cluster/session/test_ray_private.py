"""Ray's private names the farm uses are all in cluster/session/ray_private.py, and each still exists in the
installed Ray: a Ray upgrade that moves one fails here, naming it, instead of deep inside a run."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

from cluster.session.ray_private import SYMBOLS

ROOT = Path(__file__).resolve().parents[3]
PRIVATE = re.compile(r"\bray\.(_private|_raylet|experimental\.internal_kv|llm\._internal)\b|_internal_kv_|"
                     r"_get_global_client|from ray\.experimental import internal_kv|from ray\._")


def test_every_private_name_the_farm_uses_exists_in_this_ray():
    missing = []
    for module_name, attribute in SYMBOLS:
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            missing.append(f"{module_name} (import failed: {exc})")
            continue
        if not hasattr(module, attribute):
            missing.append(f"{module_name}.{attribute}")
    assert missing == [], f"this Ray moved what cluster/session/ray_private.py reaches: {missing}"


def test_no_private_ray_name_outside_its_one_module():
    users = [f"{path.relative_to(ROOT)}:{number}"
             for folder in ("cluster", "examples") for path in sorted((ROOT / folder).rglob("*.py"))
             if path.name != "ray_private.py"
             for number, line in enumerate(path.read_text().splitlines(), 1) if PRIVATE.search(line)]
    assert users == [], "use cluster/session/ray_private.py for Ray's private APIs"
