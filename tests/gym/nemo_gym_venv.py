"""NeMo Gym 0.7.0 checks our wire shapes, from a venv of its own (``foreign_venvs.NEMO_GYM``; the session fixture
``nemo_gym`` in ``conftest.py`` gives a ``NemoGymVenv`` on it): its own pydantic models validate our bodies and its
session conformance check runs against our apps, without its pins reaching our venv.

Run as a script *inside* that venv, this file is the child that does the checks, kept for the test session: one JSON
request per line on its stdin, one marked JSON answer per line on its stdout. It imports only the standard library
at the top level, for that reason."""

from __future__ import annotations

import contextlib
import importlib
import json
import shutil
import subprocess
import sys
import tempfile
import threading
import traceback
from pathlib import Path
from typing import Any, Optional

REPO = Path(__file__).resolve().parents[2]
MARK = "@@rollout-farm-nemo-gym-answer@@ "


class NemoGymVenv:
    """The checks, run in a child of the NeMo Gym venv whose python is ``python``."""

    def __init__(self, python: Path):
        self.python = python
        self._lock = threading.Lock()
        self._process: Optional[subprocess.Popen] = None
        self._workdir: Optional[str] = None
        self._stderr: Any = None

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
