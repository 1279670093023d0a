"""A separate virtualenv holding NeMo Gym 0.7.0, so our tests can check our wire shapes against its own pydantic
models and run its session conformance check without its pins reaching our venv.

NeMo Gym 0.7.0 declares Python >= 3.13 and a long list of requirements (ray, vllm extras, mlflow, ...), but the
modules we check against import on 3.11 with a much smaller set. So it is installed with ``--no-deps
--ignore-requires-python`` and then only the packages those modules import at the top level (``RUNTIME``).
``nemo_gym.global_config`` reads ray's distribution version at import time (it never imports ray there), so the
venv gets a metadata-only ``ray`` record instead of ray itself.

The venv is built once per machine in ``<repo>/.venv-nemo-gym`` (or ``$ROLLOUT_NEMO_GYM_VENV``) under a file lock,
and reused while it still imports. Run as a script *inside* that venv, this file is the child that does the
checks, kept for the test session: one JSON request per line on its stdin, one marked JSON answer per line on its
stdout. It imports only the standard library at the top level, for that reason."""

from __future__ import annotations

import contextlib
import fcntl
import importlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path
from typing import Any, Iterator, Optional

REPO = Path(__file__).resolve().parents[2]
NEMO_GYM = "nemo-gym==0.7.0"
# what the modules below import at the top level, pinned to versions known to work together on Python 3.11
RUNTIME = [
    "openai==2.44.0", "fastapi==0.165.0", "starlette==1.10.0", "pydantic==2.14.4", "uvicorn==0.54.0",
    "httptools==0.9.0", "httpx==0.28.1", "aiohttp==3.14.5", "requests==2.34.2", "itsdangerous==2.2.0",
    "orjson==3.13.0", "rich==15.0.0", "omegaconf==2.3.1", "hydra-core==1.3.8", "pydot==4.0.1", "yappi==1.7.6",
    "pandas==3.1.1", "scipy==1.17.1", "wandb==0.31.0",
]
MODULES = [
    "nemo_gym.base_resources_server", "nemo_gym.base_responses_api_agent", "nemo_gym.episode_types",
    "nemo_gym.failure_kinds", "nemo_gym.single_agent_turn_types", "nemo_gym.rollout_outcomes",
    "nemo_gym.testing.session_conformance",
]
PROBE = "import importlib\nfor m in %r: importlib.import_module(m)" % (MODULES,)
READY = "rollout-farm-ready.json"
MARK = "@@rollout-farm-nemo-gym-answer@@ "


class NemoGymUnavailable(RuntimeError):
    """The venv could not be built (no network, no index, a package that will not install)."""


def default_path() -> Path:
    return Path(os.environ.get("ROLLOUT_NEMO_GYM_VENV") or REPO / ".venv-nemo-gym")


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    lock_path = path.with_name(path.name + ".lock")
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


class NemoGymVenv:
    """The NeMo Gym venv at ``path``: ``ensure()`` builds or reuses it; the checks run in a child there."""

    def __init__(self, path: Optional[Path] = None):
        self.path = Path(path or default_path())
        self.python = self.path / "bin" / "python"
        self.build_seconds: Optional[float] = None
        self.reused = False
        self._lock = threading.Lock()
        self._process: Optional[subprocess.Popen] = None
        self._workdir: Optional[str] = None
        self._stderr: Any = None

    def _run(self, *args: str, timeout: float = 900, cwd: Optional[str] = None) -> subprocess.CompletedProcess:
        return subprocess.run(args, capture_output=True, text=True, timeout=timeout, cwd=cwd)

    def imports(self) -> bool:
        if not (self.path / READY).exists() or not self.python.exists():
            return False
        return self._run(str(self.python), "-c", PROBE, timeout=300).returncode == 0

    def ensure(self) -> "NemoGymVenv":
        with _locked(self.path):
            if self.imports():
                self.reused = True
                self.build_seconds = json.loads((self.path / READY).read_text()).get("build_seconds")
                return self
            self._build()
        return self

    def _pip(self, *args: str) -> None:
        out = self._run(str(self.python), "-m", "pip", "install", "--disable-pip-version-check", "-q", *args)
        if out.returncode != 0:
            noise = "is ignored: it is neither a file nor a directory"
            lines = [line for line in (out.stdout + out.stderr).splitlines() if noise not in line]
            raise NemoGymUnavailable(f"pip install {' '.join(args)} failed:\n" + "\n".join(lines[-30:]))

    def _build(self) -> None:
        started = time.monotonic()
        shutil.rmtree(self.path, ignore_errors=True)
        made = self._run(sys.executable, "-m", "venv", str(self.path))
        if made.returncode != 0:
            raise NemoGymUnavailable(f"python -m venv failed: {made.stderr[-2000:]}")
        self._pip("--no-deps", "--ignore-requires-python", NEMO_GYM)
        self._pip(*RUNTIME)
        purelib = self._run(str(self.python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])")
        stub = Path(purelib.stdout.strip()) / "ray-0.0.0.dist-info"
        stub.mkdir(parents=True, exist_ok=True)
        (stub / "METADATA").write_text("Metadata-Version: 2.1\nName: ray\nVersion: 0.0.0\nSummary: metadata "
                                       "only, no code: nemo_gym.global_config reads ray's version at import\n")
        out = self._run(str(self.python), "-c", PROBE, timeout=300)
        if out.returncode != 0:
            raise NemoGymUnavailable(f"NeMo Gym does not import in the new venv:\n{out.stderr[-3000:]}")
        self.build_seconds = round(time.monotonic() - started, 1)
        (self.path / READY).write_text(json.dumps({"build_seconds": self.build_seconds, "nemo_gym": NEMO_GYM,
                                                   "runtime": RUNTIME}))

    def _child(self, request: dict) -> Any:
        """One request to the child (started on first use, then kept: NeMo Gym takes seconds to import)."""
        with self._lock:
            if self._process is None or self._process.poll() is not None:
                self._workdir = self._workdir or tempfile.mkdtemp(prefix="nemo-gym-child-")
                self._stderr = tempfile.TemporaryFile(mode="w+")
                self._process = subprocess.Popen([str(self.python), __file__, str(REPO)], cwd=self._workdir,
                                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr,
                                                 text=True)
            assert self._process.stdin and self._process.stdout
            self._process.stdin.write(json.dumps(request) + "\n")
            self._process.stdin.flush()
            for line in self._process.stdout:
                if line.startswith(MARK):
                    answer = json.loads(line[len(MARK):])
                    if not answer["ok"]:
                        raise RuntimeError(f"the NeMo Gym child failed:\n{answer['error']}")
                    return answer["value"]
            self._stderr.seek(0)
            raise RuntimeError(f"the NeMo Gym child died:\n{self._stderr.read()[-4000:]}")

    def close(self) -> None:
        """End the child, if one was started."""
        if self._process is not None:
            with contextlib.suppress(OSError):
                self._process.stdin.close()  # type: ignore[union-attr]
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
            self._process = None
            self._stderr.close()
        if self._workdir:
            shutil.rmtree(self._workdir, ignore_errors=True)
            self._workdir = None

    def validate_many(self, pairs: list[tuple[str, dict]]) -> list[dict]:
        """Each body validated by its NeMo Gym model (``"module:Class"``) in one child; the validated values as
        JSON. An AssertionError with NeMo's error text names every body refused."""
        results = self._child({"op": "validate", "items": [[model, body] for model, body in pairs]})
        refused = [f"{model} refused body #{i}:\n{result['error']}"
                   for i, ((model, _body), result) in enumerate(zip(pairs, results)) if not result["ok"]]
        if refused:
            raise AssertionError("\n\n".join(refused))
        return [result["value"] for result in results]

    def validate(self, model: str, body: dict) -> dict:
        return self.validate_many([(model, body)])[0]

    def check_session_contract(self, app_factory: str, keeps_state: bool, task_data: Optional[dict] = None) -> None:
        """NeMo Gym's ``check_resources_session_contract`` against the app ``app_factory`` (``"module:function"``,
        imported from this repository) builds; an AssertionError carries NeMo's complaint."""
        error = self._child({"op": "session_contract", "factory": app_factory, "keeps_state": keeps_state,
                             "task_data": task_data or {}})
        if error:
            raise AssertionError(f"{app_factory} breaks NeMo Gym's session contract:\n{error}")


def forgetful_app() -> Any:
    """A negative control for the session check: answers every seed and close with 200 and remembers nothing."""
    from fastapi import FastAPI

    app = FastAPI()

    @app.post("/seed_session")
    @app.post("/close_session")
    async def echo(body: dict) -> dict:
        return {"resources_session_id": body["resources_session_id"]}

    return app


# ---- the child, run by the NeMo Gym venv's python -----------------------------------------------------------------

def _load(spec: str) -> Any:
    module, _, name = spec.partition(":")
    return getattr(importlib.import_module(module), name)


def _validate(items: list) -> list[dict]:
    from pydantic import ValidationError

    results = []
    for model, body in items:
        try:
            value = _load(model).model_validate(body)
            results.append({"ok": True, "value": value.model_dump(mode="json")})
        except ValidationError as error:
            results.append({"ok": False, "error": str(error)})
    return results


def _session_contract(request: dict) -> Optional[str]:
    import uuid

    from nemo_gym.base_resources_server import ResourcesSeedSessionRequest
    from nemo_gym.testing.session_conformance import check_resources_session_contract

    seed = ResourcesSeedSessionRequest.model_validate({
        "resources_session_id": f"conformance-{uuid.uuid4().hex[:12]}",
        "episode_id": {"rollout_id": "conformance", "attempt": 0},
        "task_id": {"taskset": "rollout-farm:conformance", "task_id": "t-0"},
        "task_data": request["task_data"],
    })
    try:
        check_resources_session_contract(_load(request["factory"])(), seed, keeps_state=request["keeps_state"])
    except AssertionError as error:
        return str(error) or repr(error)
    return None


def _serve(repo: str) -> None:
    """Answer one JSON request per stdin line with one marked JSON line on stdout, until stdin closes."""
    sys.path.insert(0, repo)
    answers, sys.stdout = sys.stdout, sys.stderr  # whatever else prints goes to stderr
    for line in sys.stdin:
        request = json.loads(line)
        try:
            value = _validate(request["items"]) if request["op"] == "validate" else _session_contract(request)
            answer = {"ok": True, "value": value}
        except Exception:  # noqa: BLE001 - the parent shows it
            answer = {"ok": False, "error": traceback.format_exc()}
        answers.write(MARK + json.dumps(answer) + "\n")
        answers.flush()


if __name__ == "__main__":
    _serve(sys.argv[1])
