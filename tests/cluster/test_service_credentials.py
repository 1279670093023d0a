"""Nothing open to the network by accident: every service the farm listens with, bound to an address another machine
reaches, answers only with its token, and bound to 127.0.0.1 needs none.

"Another machine" is a network namespace of this module's own (as root, with iproute2): a veth pair whose host end
sits on a bridge of its own with the subnet's first address, which each service binds; the requests are sent from
inside the namespace with curl. The live page, the scripted server, the agent server (in process and on Serve), and
the model's HTTP face on Ray Serve (the scripted kind; Ray's vLLM ingress with its guard, on the tiny model) are each
asked without a token, with a wrong one and with the right one; a run on Ray and the agent server's gateway reach a
face beyond loopback with the key they were given. The Serve tests restart Serve on the bridge's address and shut it
down after them (the next user starts it on 127.0.0.1 again)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cluster.serving.scripted_server.server import ScriptedServerConfig, serve_in_thread
from cluster.web.live_page import start_for_run
from rollout.config.load import validate
from rollout.errors import ConfigError

CHAT = {"model": "scripted", "messages": [{"role": "user", "content": "hi"}]}
DEMO_DATA = Path(__file__).resolve().parents[2] / "configs" / "data" / "local_demo.jsonl"


class Namespace:
    """A network namespace reached from this machine over a bridge: ``host`` is this machine's address there."""

    def __init__(self, name: str, bridge: str, subnet: str):
        self.name, self.bridge, self.subnet = name, bridge, subnet
        self.host, self.inside = f"{subnet}.1", f"{subnet}.2"

    def request(self, url: str, *, token: str | None = None, body: dict | None = None,
                header: str = "Authorization") -> tuple[int, str]:
        """``url`` fetched from inside the namespace (POST with ``body``): its status and body."""
        command = ["ip", "netns", "exec", self.name, "curl", "-sS", "-m", "60", "-w", "\n%{http_code}", url]
        if token is not None:
            command += ["-H", f"{header}: Bearer {token}" if header == "Authorization" else f"{header}: {token}"]
        if body is not None:
            command += ["-H", "Content-Type: application/json", "--data-binary", json.dumps(body)]
        done = subprocess.run(command, capture_output=True, text=True, timeout=90)
        assert done.returncode == 0, f"curl from the namespace failed: {done.stderr}"
        text, _, status = done.stdout.rpartition("\n")
        return int(status), text


def _ip(*args: str, check: bool = True) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")


@pytest.fixture(scope="module")
def netns(request) -> Namespace:
    if os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("curl"):
        why = "another machine's namespace needs root, iproute2 and curl"
        pytest.fail(why) if os.environ.get("ROLLOUT_REQUIRE_DOCKER") else pytest.skip(why)
    tag = os.getpid() % 1000
    space = Namespace(f"rfcred{tag}ns", f"rfcred{tag}", f"10.250.{os.getpid() % 250}")
    host_end, ns_end = f"rfcred{tag}h", f"rfcred{tag}n"

    def remove() -> None:
        _ip("netns", "del", space.name, check=False)  # its end of the pair goes with it, and so the pair
        _ip("link", "del", host_end, check=False)
        _ip("link", "del", space.bridge, check=False)

    request.addfinalizer(remove)
    remove()  # a namespace a killed run of this process id left behind
    for step in (("link", "add", space.bridge, "type", "bridge"),
                 ("addr", "add", f"{space.host}/24", "dev", space.bridge),
                 ("link", "set", space.bridge, "up"),
                 ("netns", "add", space.name),
                 ("link", "add", host_end, "type", "veth", "peer", "name", ns_end),
                 ("link", "set", host_end, "master", space.bridge),
                 ("link", "set", host_end, "up"),
                 ("link", "set", ns_end, "netns", space.name),
                 ("-n", space.name, "addr", "add", f"{space.inside}/24", "dev", ns_end),
                 ("-n", space.name, "link", "set", ns_end, "up"),
                 ("-n", space.name, "link", "set", "lo", "up")):
        _ip(*step)
    return space


def assert_guarded(netns: Namespace, url: str, token: str, body: dict | None = None) -> str:
    """No token and a wrong one: 401 saying how to pass it, never the token; the right one: the reply's body."""
    for given in (None, token[:-1] + ("x" if token[-1] != "x" else "y")):
        status, text = netns.request(url, token=given, body=body)
        assert status == 401, (given, text)
        assert "Authorization: Bearer" in text and token not in text
    status, text = netns.request(url, token=token, body=body)
    assert status == 200, text
    return text


# ---- the live page ------------------------------------------------------------------------------------------------


def test_the_live_page_off_loopback_answers_only_with_its_token(netns, tmp_path):
    page = start_for_run(tmp_path, host=netns.host)
    try:
        assert page.token and page.url.endswith(f"?token={page.token}")
        assert_guarded(netns, f"http://{netns.host}:{page.port}/api/state", page.token)
        status, _ = netns.request(f"http://{netns.host}:{page.port}/api/state", token=page.token,
                                  header="X-Rollout-Token")
        assert status == 200
    finally:
        page.stop()
    local = start_for_run(tmp_path, host="127.0.0.1")
    try:
        assert local.token is None
        status, _ = _local(f"http://127.0.0.1:{local.port}/api/state")
        assert status == 200
    finally:
        local.stop()


def _local(url: str, body: dict | None = None) -> tuple[int, str]:
    """A request from this machine, no token."""
    import httpx

    reply = httpx.post(url, json=body, timeout=30) if body is not None else httpx.get(url, timeout=30)
    return reply.status_code, reply.text


# ---- the scripted server ------------------------------------------------------------------------------------------


def test_the_scripted_server_off_loopback_answers_only_with_its_token(netns):
    with serve_in_thread(ScriptedServerConfig(host=netns.host)) as server:
        assert server.token and server.token_generated
        text = assert_guarded(netns, server.url + "/chat/completions", server.token, body=CHAT)
        assert json.loads(text)["choices"][0]["message"]["role"] == "assistant"
        assert netns.request(server.root_url + "/admin/stats")[0] == 401  # its admin routes too
    with serve_in_thread(ScriptedServerConfig(host=netns.host, token="chosen-token")) as server:
        assert server.token == "chosen-token" and not server.token_generated
        assert_guarded(netns, server.url + "/models", "chosen-token")
    with serve_in_thread(ScriptedServerConfig()) as server:
        assert server.token is None
        assert _local(server.url + "/chat/completions", CHAT)[0] == 200


@pytest.mark.parametrize("bad", ["", "   ", "\n"])
def test_a_blank_token_is_a_config_error_naming_its_field_and_a_token_files_newline_is_dropped(bad):
    from cluster.config.gym_section import GymSection
    from cluster.serving.config import ServeSection

    for model, name, field in ((ScriptedServerConfig, "token", "token"), (GymSection, "token", "gym.token"),
                               (ServeSection, "api_key", "serve.api_key")):
        base = {"app": "scripted"} if model is ServeSection else {}
        with pytest.raises(ConfigError) as caught:
            validate(model, {**base, name: bad}, prefix=field.rpartition(".")[0])
        assert caught.value.field == field
        assert getattr(validate(model, {**base, name: "s3cret\n"}), name) == "s3cret"


# ---- the agent server ---------------------------------------------------------------------------------------------


def test_the_agent_server_off_loopback_answers_only_with_its_token(netns, calc):
    from cluster.farm.rollout_farm import RolloutFarm
    from cluster.gym.agent_app import EpisodeRunner, build_app
    from cluster.gym.server import prepared
    from envs.resources.calc_server import calc_rows
    from envs.resources.serving import serve_in_thread as serve_app

    raw, settings = prepared({**run_config(calc.url), "gym": {"host": netns.host, "port": 0}})
    assert settings.token  # generated: the host is not loopback
    farm = RolloutFarm.from_config(raw).start()
    try:
        with serve_app(build_app(EpisodeRunner(farm, settings)), netns.host) as server:
            row = calc_rows(1, seed=3)[0]
            reply = json.loads(assert_guarded(netns, server.url + "/run", settings.token, body=row))
            assert reply["reward"] == 1.0
            status, text = netns.request(server.url + "/health")  # open, and it says nothing else
            assert (status, json.loads(text)) == (200, {"status": "ok"})
        _, local = prepared({**run_config(calc.url), "gym": {"port": 0}})
        assert local.token is None
        with serve_app(build_app(EpisodeRunner(farm, local))) as server:
            status, text = _local(server.url + "/run", calc_rows(1, seed=4)[0])
            assert status == 200 and json.loads(text)["reward"] == 1.0
    finally:
        farm.close()


def run_config(resources_url: str) -> dict:
    """A farm of the scripted tool user (played in this process) over the calculator resources server."""
    return {"model": {"type": "openai", "max_retries": 1, "backoff": 0.0},
            "serve": {"app": "scripted", "in_process": True, "policy": "tool_user"},
            "agent": {"type": "tool_calling", "max_steps": 6},
            "environment": {"type": "resources", "url": resources_url, "timeout": 10},
            "farm": {"backend": "local"}, "run": {"max_attempts": 2}}


# ---- the model's HTTP face on Ray Serve ---------------------------------------------------------------------------


@pytest.mark.ray
def test_the_scripted_face_on_loopback_needs_no_key(ray_cluster):
    from cluster.serving import apps
    from cluster.serving.config import ServeSection
    from cluster.session.ray_private import serve_http_config, serve_running

    if serve_running() and not serve_http_config().host.startswith("127."):
        pytest.skip("Serve already runs beyond loopback in this session")
    section = ServeSection(app="scripted", name="credentials-local", route_prefix="/credentials-local",
                           policy="demo", handle_calls=False)
    served = apps.start(section, "scripted", out=_Lines())
    try:
        assert served.api_key is None
        status, text = _local(served.base_url + "/chat/completions", CHAT)
        assert status == 200, text
    finally:
        served.stop()


@pytest.fixture(scope="module")
def wide_serve(netns, ray_cluster):
    """Serve's proxy on the namespace's bridge address (Serve restarted there, and shut down afterwards so that the
    next user starts it on 127.0.0.1 again)."""
    from ray import serve

    from cluster.session.ray_private import serve_running

    if serve_running():
        serve.shutdown()
    yield netns.host
    serve.shutdown()


@pytest.mark.ray
@pytest.mark.slow
def test_the_scripted_face_off_loopback_answers_only_with_its_key_and_a_run_sends_it(wide_serve, netns):
    from cluster.serving import apps
    from cluster.serving.config import ServeSection
    from cluster.serving.kinds import app_for
    from rollout.models.client.config import OpenAIModelConfig

    section = ServeSection(app="scripted", name="credentials-scripted", host=wide_serve, policy="demo",
                           handle_calls=False)
    out = _Lines()
    served = apps.start(section, "scripted", out=out)
    try:
        assert served.api_key == section.key() and served.base_url.startswith(f"http://{wide_serve}:")
        said = [line for line in out.lines if "needs" in line]
        assert len(said) == 1 and served.api_key in said[0] and "Authorization: Bearer" in said[0]
        assert_guarded(netns, served.base_url + "/models", served.api_key)
        text = assert_guarded(netns, served.base_url + "/chat/completions", served.api_key, body=CHAT)
        assert json.loads(text)["choices"][0]["message"]["content"]
        # the run's own client is given the key (compose applies the kind's overrides), and its calls pass
        overrides = app_for(section).model_overrides(section, OpenAIModelConfig())
        assert overrides["api_key"] == served.api_key
        assert _client_call(served.base_url, overrides["api_key"]).message["content"]
    finally:
        served.stop()


@pytest.mark.ray
@pytest.mark.slow
def test_a_later_run_reusing_a_kept_face_gets_in_with_its_own_key_until_it_ends(wide_serve, netns):
    import time

    from cluster.serving import apps
    from cluster.serving.config import ServeSection

    fields = {"app": "scripted", "name": "credentials-kept", "route_prefix": "/kept", "host": wide_serve,
              "policy": "demo", "keep": True}
    first = apps.start(ServeSection(**fields), "scripted", out=_Lines())
    try:
        out = _Lines()
        later = apps.start(ServeSection(**fields), "scripted", out=out)  # another run's process: another key
        assert any("reused" in line for line in out.lines) and later.api_key != first.api_key
        assert_guarded(netns, later.base_url + "/models", later.api_key)
        later.stop()  # kept; its key withdrawn (a replica reads the store again a second later)
        time.sleep(1.5)
        assert netns.request(later.base_url + "/models", token=later.api_key)[0] == 401
        assert netns.request(first.base_url + "/models", token=first.api_key)[0] == 200
    finally:
        first.section = first.section.model_copy(update={"keep": False})
        first.stop()


@pytest.mark.ray
@pytest.mark.slow
def test_a_run_on_ray_reaches_its_face_off_loopback_through_the_proxy(wide_serve):
    """The farm's workers call the model through Serve's proxy (``handle_calls: false``) on the bridge address: the
    composer gave their client the key the face was deployed with."""
    from cluster import RolloutFarm

    rows = [json.loads(line) for line in DEMO_DATA.read_text().splitlines()]
    rows = [r for r in rows if r.get("kind") == "shell"][:2]
    config = {"model": {"type": "openai", "model": "scripted", "max_retries": 0},
              "serve": {"app": "scripted", "policy": "demo", "name": "credentials-run", "host": wide_serve,
                        "handle_calls": False},
              "agent": {"type": "mini_swe", "max_steps": 12},
              "environment": {"type": "shell", "command_timeout": 10, "setup_from_task": True},
              "runtime": {"type": "local"}, "verifier": {"type": "check_command"},
              "farm": {"backend": "ray"}, "run": {"concurrency": 2, "max_attempts": 1}}
    with RolloutFarm.from_config(config) as farm:
        batch = farm.generate(rows, n=1)
    assert batch.rewards == [[1.0], [1.0]], batch.describe()


@pytest.mark.ray
@pytest.mark.slow
def test_the_agent_server_on_serve_off_loopback_answers_only_with_its_token(wide_serve, netns, calc):
    import time

    from cluster.assembly import FarmAssembly
    from cluster.gym.server import deploy, prepared
    from envs.resources.calc_server import calc_rows

    raw, settings = prepared({"model": {"type": "scripted", "policy": "calculator"},
                              "agent": {"type": "tool_calling", "max_steps": 6},
                              "environment": {"type": "resources", "url": calc.url},
                              "gym": {"serve": True, "host": wide_serve, "port": 0, "route_prefix": "/gym"}})
    assert settings.token
    assembly = FarmAssembly(backend=None)
    url = deploy(assembly, {**raw, "gym": {"token": settings.token}}, settings, name="credentials-gym")
    try:
        assert url.startswith(f"http://{wide_serve}:") and url.endswith("/gym")
        deadline = time.monotonic() + 90
        while netns.request(url + "/health")[0] != 200:  # open, below the route prefix too
            assert time.monotonic() < deadline, "the agent server did not answer /health"
            time.sleep(0.5)
        reply = json.loads(assert_guarded(netns, url + "/run", settings.token, body=calc_rows(1, seed=4)[0]))
        assert reply["reward"] == 1.0
    finally:
        assembly.stop_ingress()


@pytest.mark.ray
@pytest.mark.slow
def test_the_agent_servers_gateway_calls_the_runs_model_with_its_key(wide_serve, calc):
    """The agent server (on loopback: no token of its own) in front of a model whose face is beyond loopback: its
    per-rollout gateway forwards with the face's key."""
    import httpx

    from cluster.gym.server import build
    from envs.resources.serving import serve_in_thread as serve_app

    raw = {"model": {"type": "openai", "model": "scripted", "max_retries": 0},
           "serve": {"app": "scripted", "policy": "tool_user", "name": "credentials-gateway", "host": wide_serve,
                     "handle_calls": False},
           "agent": {"type": "tool_calling", "max_steps": 6},
           "environment": {"type": "resources", "url": calc.url, "timeout": 10}, "farm": {"backend": "ray"}}
    farm, app = build(raw)
    try:
        assert farm.source.base_url.startswith(f"http://{wide_serve}:")
        with serve_app(app) as server:
            chat = httpx.post(server.url + "/rollouts/r-1/v1/chat/completions", timeout=60, json={
                "model": "scripted", "messages": [{"role": "user", "content": "Compute 2 + 3."}]})
            assert chat.status_code == 200, chat.text
    finally:
        farm.close()


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.vllm
def test_the_vllm_face_off_loopback_answers_only_with_its_key_its_controls_too(wide_serve, netns, vllm_available,
                                                                                tmp_path_factory):
    """Ray's own OpenAI ingress (its development one, with the control routes) behind the guard, on a real engine:
    the tiny CPU model."""
    from cluster.serving import apps
    from cluster.serving.config import ServeSection
    from cluster.serving.tiny_model import write_tiny_model

    source = str(write_tiny_model(tmp_path_factory.mktemp("tiny") / "m", seed=0))
    section = ServeSection(app="vllm", name="credentials-vllm", host=wide_serve, model_source=source, cpu=True,
                           engine_kwargs={"max_model_len": 512, "dtype": "float32"}, ready_timeout=600)
    served = apps.start(section, "tiny", out=_Lines())
    try:
        assert served.api_key and served.base_url.startswith(f"http://{wide_serve}:")
        assert_guarded(netns, served.base_url + "/models", served.api_key)
        body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        assert json.loads(assert_guarded(netns, served.base_url + "/chat/completions", served.api_key, body=body))
        status, _ = netns.request(served.root_url + "/reset_prefix_cache", body={"model": "tiny"})
        assert status == 401  # Ray's control routes too
        served.controls().reset_prefix_cache()  # the controls send the key
    finally:
        served.stop()


def _client_call(base_url: str, api_key: str):
    import asyncio

    from rollout.models.client.model import OpenAIModel

    model = OpenAIModel(base_url=base_url, model="scripted", api_key=api_key, max_retries=0)
    return asyncio.run(model.complete([{"role": "user", "content": "hi"}]))


class _Lines:
    def __init__(self):
        self.lines: list[str] = []

    def write(self, text: str) -> None:
        self.lines += [line for line in text.splitlines() if line]
        sys.stderr.write(text)

    def flush(self) -> None:
        pass


def test_the_vllm_ingress_guard_sits_in_front_of_every_route_of_the_app(netns):
    """Ray's ingress builder hands each route factory the ingress's FastAPI app: the guard our first route puts in
    front of it covers every route, Ray's own included (here a stand-in app, served on the bridge address)."""
    from fastapi import FastAPI

    from cluster.serving.generate_route import ROUTES, guarded
    from envs.resources.serving import serve_in_thread as serve_app

    app = FastAPI()
    rays_own = app.get("/v1/models")(_models)  # as Ray adds its routes before ours
    routes = guarded(ROUTES, "face-key")
    for name, factory in routes.items():
        factory(app)(_generate)
    assert rays_own is _models
    with serve_app(app, netns.host) as server:
        assert_guarded(netns, server.url + "/v1/models", "face-key")
        assert_guarded(netns, server.url + "/inference/v1/generate", "face-key", body={"model": "m"})
    assert guarded(ROUTES, None) is ROUTES


async def _models() -> dict:
    return {"data": [{"id": "m"}]}


async def _generate() -> dict:
    return {"choices": []}



@pytest.fixture(scope="module")
def calc():
    """The calculator resources server on 127.0.0.1 (the agent server's environment)."""
    from envs.resources.calc_server import create_app
    from envs.resources.serving import serve_in_thread as serve_app

    with serve_app(create_app()) as server:
        yield server
