"""Software we did not write, each in a virtualenv of its own built from PyPI, so that it reads what we write
without its pins reaching our venv: Harbor 0.25.0 (its ATIF validator, trace export, ``TaskConfig``), NeMo Gym 0.7.0
(its models, its session check), swebench 5.0.2 (its grading), mini-swe-agent (pyproject's pin: its batch runner
and inspector) and renderers 0.1.12 (its generate client). One builder and one rule for all of them:

- each is built once per machine in ``~/.cache/rollout-farm/venvs/<name>`` (``$ROLLOUT_VENVS`` names another
  folder), under a file lock, and reused while its stamp names the same installs and its probe passes; a session
  asks for each at most once (a session fixture each, in ``conftest.py``);
- where one cannot be built (no package index) its tests skip, or fail when its ``ROLLOUT_REQUIRE_*`` is set (CI);
- ``run_function`` runs a function's source in such a venv (it imports what it needs itself) and returns its JSON
  answer.

Only the standard library at the top level: the venvs' own children may import this file."""

from __future__ import annotations

import fcntl
import hashlib
import inspect
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
READY = "rollout-farm-ready.json"
MARK = "@@rollout-farm-foreign-answer@@ "


class VenvUnavailable(RuntimeError):
    """A venv could not be built (no network, no index, a package that will not install or import)."""


@dataclass(frozen=True)
class ForeignVenv:
    name: str
    """The folder's name: the package and its version."""
    installs: tuple[tuple[str, ...], ...]
    """``pip install`` argument lists, in order (the package without its dependencies first, where its declared
    requirements are far more than the modules checked import)."""
    probe: tuple[str, ...]
    """What the venv's python runs to show it is usable (exit 0)."""
    require: str
    """The variable that turns a venv that cannot be built from a skip into a failure."""
    finish: Optional[Callable[[Path], None]] = None
    """A step after the installs, given the venv's python."""

    def path(self) -> Path:
        cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
        return Path(os.environ.get("ROLLOUT_VENVS") or cache / "rollout-farm" / "venvs") / self.name

    def stamp(self) -> dict[str, Any]:
        return {"installs": [list(args) for args in self.installs], "python": list(sys.version_info[:2])}


def _run(*args: str, timeout: float = 900, stdin: Optional[str] = None) -> subprocess.CompletedProcess:
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, input=stdin)


def _check(out: subprocess.CompletedProcess, what: str) -> None:
    if out.returncode != 0:
        lines = [line for line in (out.stdout + out.stderr).splitlines() if "is ignored: it is neither" not in line]
        raise VenvUnavailable(f"{what} failed:\n" + "\n".join(lines[-30:]))


def build(spec: ForeignVenv) -> Path:
    """The python of ``spec``'s venv: reused when its stamp is ``spec``'s and its probe passes, else built anew."""
    path = spec.path()
    python, ready = path / "bin" / "python", path / READY
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if ready.exists() and json.loads(ready.read_text()).get("stamp") == spec.stamp() \
                and _run(str(python), *spec.probe, timeout=300).returncode == 0:
            return python
        started = time.monotonic()
        shutil.rmtree(path, ignore_errors=True)
        _check(_run(sys.executable, "-m", "venv", str(path)), "python -m venv")
        for args in spec.installs:
            _check(_run(str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", *args),
                   "pip install " + " ".join(args))
        if spec.finish is not None:
            spec.finish(python)
        _check(_run(str(python), *spec.probe, timeout=300), f"the probe of {spec.name}")
        ready.write_text(json.dumps({"stamp": spec.stamp(), "build_seconds": round(time.monotonic() - started, 1)}))
    return python


def python_for(spec: ForeignVenv) -> Path:
    """``build(spec)`` for a fixture: without the venv the test skips, or fails under ``spec.require``."""
    import pytest

    try:
        return build(spec)
    except (VenvUnavailable, OSError, ValueError, subprocess.TimeoutExpired) as error:
        message = f"no {spec.name} venv: {error}"
        if os.environ.get(spec.require, "") not in ("", "0", "false", "no"):
            pytest.fail(message)
        pytest.skip(f"{message} (set {spec.require}=1 to make this an error)")


def run_function(python: Path, function: Callable[[Any], Any], request: Any, *, cwd: Optional[Path] = None,
                 env: Optional[dict[str, str]] = None, timeout: float = 300) -> Any:
    """``function(request)`` run in the venv of ``python`` (its source is the child's program: it imports what it
    needs itself), in ``cwd`` (nothing of ours on its path); its JSON answer."""
    code = (textwrap.dedent(inspect.getsource(function)) + "\nimport json, sys\n"
            f"print({MARK!r} + json.dumps({function.__name__}(json.loads(sys.stdin.read()))))\n")
    if env is None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    out = subprocess.run([str(python), "-c", code], input=json.dumps(request), capture_output=True, text=True,
                         cwd=cwd, env=env, timeout=timeout)
    return answer(out, f"{function.__name__} in {python.parents[1].name}")


def answer(out: subprocess.CompletedProcess, what: str) -> Any:
    """The marked JSON line of a child's output."""
    for line in out.stdout.splitlines():
        if line.startswith(MARK):
            return json.loads(line[len(MARK):])
    raise AssertionError(f"{what} failed ({out.returncode}):\n{out.stderr[-4000:]}")


# ---- the venvs ------------------------------------------------------------------------------------------------------


def _probe(*modules: str) -> tuple[str, ...]:
    return ("-c", "import importlib\nfor m in %r: importlib.import_module(m)" % (list(modules),))


HARBOR = ForeignVenv(
    "harbor-0.25.0",
    # Harbor declares Python >= 3.12 and a long list of requirements, but the modules checked import on 3.11 with
    # pydantic (the models) and toml (``harbor.models.task.config``).
    installs=(("--no-deps", "--ignore-requires-python", "harbor==0.25.0"), ("pydantic==2.14.4", "toml==0.10.2")),
    probe=_probe("harbor.models.trajectories", "harbor.utils.trajectory_validator", "harbor.models.task.config"),
    require="ROLLOUT_REQUIRE_HARBOR")


def _ray_record(python: Path) -> None:
    """``nemo_gym.global_config`` reads ray's distribution version at import (it never imports ray there): a
    metadata-only record instead of ray itself."""
    purelib = _run(str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])")
    record = Path(purelib.stdout.strip()) / "ray-0.0.0.dist-info"
    record.mkdir(parents=True, exist_ok=True)
    (record / "METADATA").write_text("Metadata-Version: 2.1\nName: ray\nVersion: 0.0.0\nSummary: metadata only, no "
                                     "code: nemo_gym.global_config reads ray's version at import\n")


NEMO_GYM = ForeignVenv(
    "nemo-gym-0.7.0",
    # NeMo Gym declares Python >= 3.13 and ray, vllm extras, mlflow...; the modules checked import on 3.11 with
    # these, pinned to versions known to work together.
    installs=(("--no-deps", "--ignore-requires-python", "nemo-gym==0.7.0"),
              ("openai==2.44.0", "fastapi==0.165.0", "starlette==1.10.0", "pydantic==2.14.4", "uvicorn==0.54.0",
               "httptools==0.9.0", "httpx==0.28.1", "aiohttp==3.14.5", "requests==2.34.2", "itsdangerous==2.2.0",
               "orjson==3.13.0", "rich==15.0.0", "omegaconf==2.3.1", "hydra-core==1.3.8", "pydot==4.0.1",
               "yappi==1.7.6", "pandas==3.1.1", "scipy==1.17.1", "wandb==0.31.0")),
    probe=_probe("nemo_gym.base_resources_server", "nemo_gym.base_responses_api_agent", "nemo_gym.episode_types",
                 "nemo_gym.failure_kinds", "nemo_gym.single_agent_turn_types", "nemo_gym.rollout_outcomes",
                 "nemo_gym.testing.session_conformance"),
    require="ROLLOUT_REQUIRE_NEMO_GYM", finish=_ray_record)

SWEBENCH5 = ForeignVenv(
    "swebench-5.0.2",
    # Only the grading modules, which import nothing outside the standard library but unidiff; the child loads them
    # without ``swebench.harness.__init__`` (docker, datasets, modal).
    installs=(("--no-deps", "swebench==5.0.2"), ("unidiff==1.0.1",)),
    probe=(str(TESTS / "swebench5_venv.py"), "--probe"),
    require="ROLLOUT_REQUIRE_SWEBENCH5")


def _pyproject_pin(package: str) -> str:
    """pyproject's pin of ``package`` (an extra of its own)."""
    match = re.search(rf'"({re.escape(package)}==[^"]+)"', (REPO / "pyproject.toml").read_text())
    return match[1] if match else package


MINI_SWE = ForeignVenv(
    _pyproject_pin("mini-swe-agent").replace("==", "-"),
    # Its litellm pulls boto3, whose botocore pins python-dateutil<3: the package alone, and what the modules used
    # import.
    installs=(("--no-deps", _pyproject_pin("mini-swe-agent")),
              ("pydantic==2.14.4", "jinja2==3.1.6", "pyyaml==6.0.4", "rich==15.0.0", "typer==0.29.2", "textual==8.2.8",
               "python-dotenv==1.2.4", "platformdirs==4.14.8")),
    probe=_probe("minisweagent.run.benchmarks.swebench", "minisweagent.run.utilities.inspector"),
    require="ROLLOUT_REQUIRE_MINI_SWE")

RENDERERS = ForeignVenv(
    "renderers-0.1.12",
    # renderers imports httpx without declaring it; transformers loads the tiny model's tokenizer (no torch needed).
    installs=(("renderers==0.1.12", "transformers==5.24.0", "httpx==0.28.1"),),
    probe=_probe("renderers.client", "transformers"),
    require="ROLLOUT_REQUIRE_RENDERERS")


def _beside_ours(python: Path) -> None:
    """SkyRL's interface modules import torch, ray and transformers, and its generator here calls our farm: the venv
    sees our venv's packages after its own (a ``.pth`` line), and ours is never changed. SkyRL 0.3.0 declares Python >=
    3.11, but its tinker types are pydantic models over ``typing.TypedDict``, which pydantic takes only from 3.12: on
    3.11 (the only Python torch's CPU wheel here is built for) the venv starts with ``typing.TypedDict`` set to
    ``typing_extensions``' (the one pydantic asks for there)."""
    ours = sysconfig.get_paths()["purelib"]
    purelib = _run(str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])").stdout.strip()
    lines = [f"import site; site.addsitedir({ours!r})"]
    if sys.version_info < (3, 12):
        lines.append("import typing, typing_extensions; typing.TypedDict = typing_extensions.TypedDict")
    (Path(purelib) / "zz-rollout-farm-beside.pth").write_text("\n".join(lines) + "\n")


SKYRL = ForeignVenv(
    # one per venv of ours it sits beside (a checkout's own)
    "skyrl-0.3.0-beside-" + hashlib.sha1(sys.prefix.encode()).hexdigest()[:10],
    # SkyRL declares torch, vllm, ray, flash-attn...: the package without them, and what the interface modules import
    # beyond our venv's packages.
    installs=(("--no-deps", "skyrl==0.3.0", "skyrl-gym==0.4.0", "omegaconf==2.4.0", "torchdata==0.11.0",
               "jaxtyping==0.3.11", "wadler_lindig==0.1.8"),),
    probe=_probe("skyrl.train.generators.base", "skyrl.train.generators.utils"),
    require="ROLLOUT_REQUIRE_SKYRL", finish=_beside_ours)
