"""The engine's start queue on a real docker engine: a burst of starts reaches the daemon at most ``start_limit`` at
a time, an engine that fails starts under load is tried again with backoff (a failure only after
``start_retries``, and then as infrastructure), a refusal that would be the same next time is not retried. The
faults are injected at the SDK's create call; the containers are real."""

from __future__ import annotations

import asyncio
import subprocess
import threading
import time

import docker
import pytest
import requests

from envs.runtimes.docker import start_gate
from envs.runtimes.docker.runtime import DockerRuntime
from rollout.errors import ContainerStartError

pytestmark = pytest.mark.docker

CREATE = docker.APIClient.create_container


def engine_error(code: int, text: str) -> docker.errors.APIError:
    response = requests.Response()
    response.status_code = code
    return docker.errors.APIError(text, response=response, explanation=text)


class Daemon:
    """The real daemon's create call behind a fault: ``overloaded_past`` creates in flight at once make it answer
    500 (a daemon falling over under a burst); ``failing`` creates fail first with ``code``."""

    def __init__(self, overloaded_past: int | None = None, failing: int = 0, code: int | None = 500):
        self.overloaded_past, self.failing, self.code = overloaded_past, failing, code
        self.in_flight = self.peak = self.calls = self.refused = 0
        self.lock = threading.Lock()

    def create(self, api, *args, **kwargs):
        with self.lock:
            self.calls += 1
            self.in_flight += 1
            self.peak = max(self.peak, self.in_flight)
            overloaded = self.overloaded_past is not None and self.in_flight > self.overloaded_past
            failing = self.failing > 0
            self.failing -= failing
        try:
            time.sleep(0.2)  # the daemon's own work on a create, so that a burst overlaps
            if failing and self.code is None:  # no answer at all: the SDK's read timeout
                raise requests.exceptions.ReadTimeout("UnixHTTPConnectionPool(host='localhost', port=None): Read "
                                                      "timed out. (read timeout=60)")
            if overloaded or failing:
                self.refused += 1
                raise engine_error(self.code, "Internal Server Error: OCI runtime create failed: context deadline "
                                              "exceeded" if self.code >= 500 else "No such image: nowhere:latest")
            return CREATE(api, *args, **kwargs)
        finally:
            with self.lock:
                self.in_flight -= 1


@pytest.fixture
def daemon(monkeypatch):
    def install(**faults) -> Daemon:
        found = Daemon(**faults)
        monkeypatch.setattr(docker.APIClient, "create_container", lambda api, *a, **k: found.create(api, *a, **k))
        monkeypatch.setattr(start_gate, "BACKOFF", 0.05)
        return found
    return install


def burst(image: str, count: int, **limits) -> tuple[list[BaseException | None], list[str]]:
    """``count`` runtimes started at once; what each start raised (None: started) and a command's output in each."""
    async def scenario():
        runtimes = [DockerRuntime({"image": image, **limits}, run_id="start-gate", rollout_id=f"r{k}")
                    for k in range(count)]
        try:
            raised = await asyncio.gather(*(rt.start() for rt in runtimes), return_exceptions=True)
            said = [(await rt.exec("echo up")).output for rt, exc in zip(runtimes, raised) if exc is None]
            return raised, said
        finally:
            await asyncio.gather(*(rt.close() for rt in runtimes))
    return asyncio.run(scenario())


def left() -> list[str]:
    return subprocess.run(["docker", "ps", "-aq", "--filter", "label=rollout-farm.run=start-gate"],
                          capture_output=True, text=True).stdout.split()


def test_a_burst_reaches_the_daemon_at_most_start_limit_at_a_time(base_image, daemon):
    """24 starts at once against a daemon that fails past 4 creates in flight: with ``start_limit: 4`` every
    start succeeds at the first try; without the queue's limit (``start_limit: 64``) the same burst is refused."""
    engine = daemon(overloaded_past=4)
    raised, said = burst(base_image, 24, start_limit=4, start_rate=None)
    assert raised == [None] * 24 and said == ["up\n"] * 24
    assert engine.peak <= 4 and engine.refused == 0 and engine.calls == 24
    engine = daemon(overloaded_past=4)
    burst(base_image, 24, start_limit=64, start_rate=None, start_retries=0)
    assert engine.peak > 4 and engine.refused > 0, "the fault is real: an unqueued burst overloads it"
    assert left() == []


def test_the_start_rate_paces_a_burst(base_image, daemon):
    """``start_rate: 10``: 8 starts at once are begun over about 0.7 s, not in one instant."""
    engine = daemon()
    began = time.monotonic()
    raised, _ = burst(base_image, 8, start_limit=8, start_rate=10.0)
    assert raised == [None] * 8 and engine.calls == 8
    assert time.monotonic() - began >= 0.7
    assert left() == []


def test_an_engine_error_under_load_is_tried_again_then_fails_as_infrastructure(base_image, daemon):
    """Two failed creates, then the engine answers: the start succeeds and the errors are counted; an engine that
    keeps failing fails the start after ``start_retries`` more tries, as a retryable infrastructure failure that
    names the key."""
    before = start_gate.stats().engine_errors
    engine = daemon(failing=2)
    raised, said = burst(base_image, 1, start_retries=3)
    assert raised == [None] and said == ["up\n"] and engine.calls == 3
    assert start_gate.stats().engine_errors - before == 2
    engine = daemon(failing=100)
    (raised,), _ = burst(base_image, 1, start_retries=2)
    assert isinstance(raised, ContainerStartError) and raised.retryable
    assert "runtime.start_retries=2" in str(raised) and "context deadline exceeded" in str(raised)
    assert engine.calls == 3
    assert left() == []


def test_a_refusal_that_would_repeat_is_not_retried(base_image, daemon):
    """A missing image (404) fails at once, not after backoffs, and says how to get the image."""
    engine = daemon(failing=100, code=404)
    (raised,), _ = burst(base_image, 1, start_retries=3)
    assert isinstance(raised, ContainerStartError) and not raised.retryable
    assert "rollout images" in str(raised) and engine.calls == 1


def test_rollouts_that_miss_an_image_at_once_pull_it_once(base_image, monkeypatch):
    """8 rollouts whose image is not on the engine yet (``pull: missing``): one pull, the others wait for it and
    start from the image it brought."""
    pulls, engine = [], {"has_image": False}
    inspect = docker.APIClient.inspect_image

    def create(api, *args, **kwargs):
        if not engine["has_image"]:
            raise engine_error(404, f"No such image: {base_image}")
        return CREATE(api, *args, **kwargs)

    def has(api, image):
        if not engine["has_image"]:
            raise engine_error(404, f"No such image: {image}")
        return inspect(api, image)

    def pull(api, image, *args, **kwargs):
        pulls.append(image)
        time.sleep(0.5)  # a registry's download
        engine["has_image"] = True

    monkeypatch.setattr(docker.APIClient, "create_container", create)
    monkeypatch.setattr(docker.APIClient, "inspect_image", has)
    monkeypatch.setattr(docker.APIClient, "pull", pull)
    raised, said = burst(base_image, 8, pull="missing")
    assert raised == [None] * 8 and said == ["up\n"] * 8
    assert pulls == [base_image]
    assert left() == []


def test_a_daemon_that_does_not_answer_is_not_asked_again(base_image, daemon):
    """A create the engine never answers (the client's read timeout: a hung daemon) fails the attempt at once, as
    infrastructure for the driver to run again later, instead of piling more starts onto that daemon."""
    engine = daemon(failing=100, code=None)
    (raised,), _ = burst(base_image, 1, start_retries=3)
    assert isinstance(raised, ContainerStartError) and raised.retryable
    assert "timed out" in str(raised) and engine.calls == 1
