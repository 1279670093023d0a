"""RL controls of a served model behind one small interface: pause (abort / wait / keep in-flight requests),
resume, reset the prefix cache, reload weights from a checkpoint path, label the weights (the version a generate
reply names), sleep / wake up.

``EngineControls`` drives vLLM through the control routes of Ray Serve LLM's development ingress (``serve.controls``
on) or of a ``vllm serve`` process started with ``VLLM_SERVER_DEV_MODE=1`` (``engine: subprocess``). What an
engine cannot do raises ``NotSupported``:

- vLLM's CPU backend has no sleep mode (it ignores the call): ``sleep``/``wake_up`` raise on ``cpu: true``.
- A scripted policy has no weights or cache: ``reload_weights``/``sleep``/``wake_up`` raise; pause, resume and
  the cache reset have nothing to do (the farm's own gate holds new calls back).
- An external endpoint (``app: endpoint``) is not ours to control: every call raises.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any, Literal, Sequence

from rollout.errors import NotSupported

PauseMode = Literal["abort", "wait", "keep"]


class ModelControls:
    """The interface. Every method applies to every replica of the model."""

    def pause(self, mode: PauseMode = "keep") -> None:
        """Stop generating: ``abort`` in-flight requests (they fail and are retried), ``wait`` for them, or
        ``keep`` them queued to continue on resume."""
        raise NotSupported(f"{type(self).__name__} cannot pause")

    def resume(self) -> None:
        raise NotSupported(f"{type(self).__name__} cannot resume")

    def reset_prefix_cache(self) -> None:
        raise NotSupported(f"{type(self).__name__} has no prefix cache to reset")

    def reload_weights(self, path: str) -> None:
        """Load the weights at ``path`` (a checkpoint of the same architecture) into the running engine."""
        raise NotSupported(f"{type(self).__name__} cannot reload weights")

    def set_weight_version(self, version: str) -> None:
        """Label the weights now loaded: a ``/inference/v1/generate`` reply names the label of the weights that
        sampled its tokens (``weight_versions``)."""
        raise NotSupported(f"{type(self).__name__} has no weights to label")

    def sleep(self, level: int = 1) -> None:
        raise NotSupported(f"{type(self).__name__} cannot sleep")

    def wake_up(self) -> None:
        raise NotSupported(f"{type(self).__name__} cannot wake up")


class ScriptedControls(ModelControls):
    def pause(self, mode: PauseMode = "keep") -> None:
        pass  # nothing generates: the farm's gate holds new calls back

    def resume(self) -> None:
        pass

    def reset_prefix_cache(self) -> None:
        pass

    def reload_weights(self, path: str) -> None:
        raise NotSupported("a scripted policy has no weights to reload")

    def set_weight_version(self, version: str) -> None:
        pass  # a scripted reply names the version its request carries

    def sleep(self, level: int = 1) -> None:
        raise NotSupported("a scripted policy has no engine to put to sleep")

    def wake_up(self) -> None:
        raise NotSupported("a scripted policy has no engine to wake up")


class EndpointControls(ModelControls):
    """An external OpenAI-compatible endpoint: not ours to control (every method raises ``NotSupported``)."""


class EngineControls(ModelControls):
    """vLLM's control routes at one or more roots: Ray Serve LLM's dev ingress (``serve_llm``, one root that
    broadcasts to every replica, the model named in the body) or ``vllm serve`` processes (``vllm``, one root
    per engine, options in the query string)."""

    def __init__(self, roots: Sequence[str] | Any, model_id: str, *, flavour: Literal["serve_llm", "vllm"],
                 cpu: bool = False, timeout: float = 600.0, api_key: str | None = None):
        self._roots, self.model_id, self.flavour, self.cpu, self.timeout = roots, model_id, flavour, cpu, timeout
        self.headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {api_key}"} if api_key
                                                                else {})}
        """Sent with every call: the key of the model's HTTP face when it has one."""

    def roots(self) -> list[str]:
        return list(self._roots() if callable(self._roots) else self._roots)

    def _post(self, path: str, body: dict[str, Any] | None = None, query: str = "") -> None:
        for root in self.roots():
            request = urllib.request.Request(f"{root}{path}{query}", data=json.dumps(body or {}).encode(),
                                             headers=self.headers, method="POST")
            try:
                with urllib.request.urlopen(request, timeout=self.timeout) as reply:
                    reply.read()
            except urllib.error.HTTPError as exc:
                detail = exc.read().decode("utf-8", "replace")[:500]
                if exc.code in (404, 405):
                    raise NotSupported(f"{root}{path}: no such control route (HTTP {exc.code}); start the engine "
                                       "with its control routes (serve.controls, VLLM_SERVER_DEV_MODE=1)") from None
                raise RuntimeError(f"POST {root}{path}: HTTP {exc.code}: {detail}") from None

    def pause(self, mode: PauseMode = "keep") -> None:
        if mode not in ("abort", "wait", "keep"):
            raise ValueError(f"pause mode must be abort, wait or keep, got {mode!r}")
        if self.flavour == "serve_llm":
            self._post("/pause", {"model": self.model_id, "options": {"mode": mode}})
        else:
            self._post("/pause", query=f"?mode={mode}")

    def resume(self) -> None:
        self._post("/resume", {"model": self.model_id} if self.flavour == "serve_llm" else None)

    def reset_prefix_cache(self) -> None:
        self._post("/reset_prefix_cache", {"model": self.model_id} if self.flavour == "serve_llm" else None)

    def reload_weights(self, path: str) -> None:
        body = {"method": "reload_weights", "kwargs": {"weights_path": str(path)}}
        self._post("/collective_rpc", {"model": self.model_id, **body} if self.flavour == "serve_llm" else body)
        self.reset_prefix_cache()  # cached prefixes were computed by the old weights

    def set_weight_version(self, version: str) -> None:
        body = {"new_version": str(version)}
        self._post("/update_weight_version", {"model": self.model_id, **body} if self.flavour == "serve_llm" else body)

    def sleep(self, level: int = 1) -> None:
        if self.cpu:
            raise NotSupported("vLLM's CPU backend has no sleep mode (it ignores the call)")
        if self.flavour == "serve_llm":
            self._post("/sleep", {"model": self.model_id, "options": {"level": level}})
        else:
            self._post("/sleep", query=f"?level={level}")

    def wake_up(self) -> None:
        if self.cpu:
            raise NotSupported("vLLM's CPU backend has no sleep mode (it ignores the call)")
        self._post("/wakeup" if self.flavour == "serve_llm" else "/wake_up",
                   {"model": self.model_id} if self.flavour == "serve_llm" else None)
