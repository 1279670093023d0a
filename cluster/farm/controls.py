"""The trainer's controls of a farm: its workers (listed, their live rollouts), their gate and policy version, and
the served model's RL controls (``cluster.serving.controls``) — pause, resume, weights, prefix cache, sleep."""

from __future__ import annotations

from typing import Any

from rollout.errors import NotSupported


class FarmControls:
    """Mixed into ``RolloutFarm`` (which provides ``start``, ``_run``, ``_backend``, ``_assembly``, ``_controls``)."""

    _engine_paused = False
    policy_version: str | int | None = None
    """The version ``set_policy_version`` last set (``max_staleness`` measures turns against it)."""

    def controls(self) -> Any:
        """The served model's controls: given to the farm (``controls=``), else those of the model its assembly
        serves (a ``serve`` section's kind, the in-process scripted server); an external endpoint's raise
        ``NotSupported``."""
        if self._controls is not None:
            return self._controls
        self.start()
        return self._assembly.controls()

    def set_policy_version(self, version: str | int | None) -> None:
        """Every model call that starts after this records ``version`` on its turn (``Step.policy_version``) and
        carries it in its request (with ``cache_salt``, a per-version prefix-cache salt)."""
        self.start()
        self._run(self._backend.broadcast("set_policy_version", version))
        changed, self.policy_version = version != self.policy_version, version
        if changed:
            self._versions_changed()

    def pause(self, mode: str | None = None) -> None:
        """No new model call starts until ``resume()``; rollouts otherwise go on. With ``mode`` the engine pauses
        too: ``abort`` its in-flight requests (retried after resume), ``wait`` for them, or ``keep`` them queued."""
        self.start()
        self._run(self._backend.broadcast("pause"))
        if mode is not None:
            self.controls().pause(mode)
            self._engine_paused = True

    def resume(self) -> None:
        self.start()
        if self._engine_paused:
            self.controls().resume()
            self._engine_paused = False
        self._run(self._backend.broadcast("resume"))

    def reload_weights(self, path: str, version: str | int | None = None) -> None:
        """Load the checkpoint at ``path`` into the served model between requests: hold new calls, let the engine
        finish what it is generating, load, reset the prefix cache, stamp ``version`` (on the workers' calls and,
        where it can, on the engine's weights), resume."""
        self.pause(mode="wait")
        try:
            self.controls().reload_weights(path)
            self._assembly.weights_changed()  # no later run takes these weights for its config's
            if version is not None:
                self.set_policy_version(version)
                try:  # the engine labels what it samples with it (a generate reply's weight_versions)
                    self.controls().set_weight_version(str(version))
                except NotSupported:
                    pass
        finally:
            self.resume()

    def reset_prefix_cache(self) -> None:
        self.controls().reset_prefix_cache()

    def sleep(self, level: int = 1) -> None:
        """Free the engine's accelerator memory between generation phases (``NotSupported`` where it cannot)."""
        self.controls().sleep(level)

    def wake_up(self) -> None:
        self.controls().wake_up()

    def workers(self) -> list[dict[str, Any]]:
        """One entry per live worker: node id, ``host:pid``, rollouts finished, in flight, policy version."""
        self.start()
        return self._run(self._backend.broadcast("info"))

    def live(self) -> list[dict[str, Any]]:
        """The rollouts in flight right now, across workers (task, sample, step, last command, node)."""
        self.start()
        return [r for rows in self._run(self._backend.broadcast("live")) for r in rows]
