"""``rollout gym serve CONFIG [key=value ...]``: the NeMo-Gym-compatible agent server over a run config's farm
(``cluster.gym.server``), in this process or as a Ray Serve application; prints its URL, serves until Ctrl-C."""

from __future__ import annotations

import signal
import sys
import threading

from cluster.cli.parser import HelpParser, config_failure
from cluster.gym.server import build, deploy, open_model, prepared
from envs.resources.serving import BackgroundServer
from rollout.access import listening_line, new_token
from rollout.config.load import load_config
from rollout.errors import ConfigError


def serve_main(argv: list[str]) -> int:
    parser = HelpParser(prog="rollout gym serve", description=__doc__.split("\n\n")[0])
    parser.add_argument("items", nargs="+", metavar="CONFIG|key=value")
    parser.add_argument("--host", default=None, help="interface (default gym.host: 127.0.0.1)")
    parser.add_argument("--port", type=int, default=None, help="port (default gym.port: 8000)")
    parser.add_argument("--serve", action="store_true", help="run as a Ray Serve application (gym.serve)")
    parser.add_argument("--address", default=None, help="Ray cluster to join (default $RAY_ADDRESS, else embedded)")
    args = parser.parse_args(argv)
    try:
        raw = load_config([i for i in args.items if "=" not in i], [i for i in args.items if "=" in i])
        gym = dict(raw.get("gym") or {})
        gym.update({k: v for k, v in (("host", args.host), ("port", args.port)) if v is not None})
        if args.serve:
            gym["serve"] = True
        raw["gym"] = gym
        if args.address:
            raw.setdefault("farm", {})["address"] = args.address
        _, settings = prepared(raw)
    except ConfigError as exc:
        return config_failure(exc)
    generated = settings.token is not None and not gym.get("token")
    if settings.token is not None:
        gym["token"] = settings.token  # the same one when the replica (or build below) prepares the config again
    stop = threading.Event()
    if settings.serve:
        assembly = open_model(raw, args.address)
        if settings.token is None and assembly.served is not None and assembly.served.api_key:
            # the model's face needs a key: Serve's proxies, which the agent server shares, listen beyond loopback
            # (or the config guards them): the agent server needs a token there too
            settings = settings.model_copy(update={"token": new_token()})
            gym["token"], generated = settings.token, True
        url = deploy(assembly, raw, settings)
        print(url, flush=True)
        _say_access(url, settings.token, generated)
        _wait(stop)
        assembly.stop_ingress()
        assembly.stop_model()
        return 0
    farm, app = build(raw)
    server = BackgroundServer(app, settings.host, settings.port).start()
    print(server.url, flush=True)
    _say_access(server.url, settings.token, generated)
    try:
        _wait(stop)
    finally:
        server.stop()
        farm.close()
    return 0


def _say_access(url: str, token: str | None, generated: bool) -> None:
    print(listening_line("the agent server", url, token, generated=generated, field="gym.token"), file=sys.stderr,
          flush=True)


def _wait(stop: threading.Event) -> None:
    # Our own handlers: Ray's driver replaces Python's SIGINT handler, so Ctrl-C would not raise here.
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    print("serving until interrupted (Ctrl-C)", file=sys.stderr, flush=True)
    while not stop.wait(3600):
        pass
