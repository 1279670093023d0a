"""``rollout serve CONFIG [key=value ...]``: deploy a config's ``serve`` section on Ray Serve and print the base
URL; ``rollout models tiny DIR``: write the tiny CPU model (random weights, a locally trained tokenizer).

On an embedded cluster ``rollout serve`` stays up until interrupted (the cluster ends with it); joining a cluster
(``--address`` or ``RAY_ADDRESS``) it deploys, prints and returns, and the application stays until
``serve delete`` or ``serve shutdown``. Exit 2 on a bad config.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

from cluster.cli.parser import HelpParser, config_failure
from rollout.errors import ConfigError


def serve_main(argv: list[str]) -> int:
    parser = HelpParser(prog="rollout serve", description=__doc__.split("\n\n")[0])
    parser.add_argument("items", nargs="+", metavar="CONFIG|key=value")
    parser.add_argument("--address", default=None, help="Ray cluster to deploy on (default $RAY_ADDRESS, else "
                        "an embedded one that lives as long as this command)")
    parser.add_argument("--port", type=int, default=None, help="Serve's HTTP port (default serve.port, else 8000)")
    args, extra = parser.parse_known_args(argv)
    if any(e.startswith("-") for e in extra):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    args.items += extra  # CONFIG and key=value items may also follow an option (--port 8001 a=b)
    from cluster.assembly import FarmAssembly
    from cluster.config import DatasetConfig, ServeSection
    from cluster.config.dataset import dataset_file
    from rollout.config.load import load_config, validate

    paths = [i for i in args.items if "=" not in i]
    raw = load_config(paths, [i for i in args.items if "=" in i])
    if not raw.get("serve") and isinstance(raw.get("model"), dict) and raw["model"].get("serve"):
        raw["serve"] = raw["model"].pop("serve")  # the same section, written inside the model's
    if not raw.get("serve"):
        return config_failure(ConfigError(f"{paths[0]} has no serve section (app: scripted | vllm | endpoint)",
                                          "serve"))
    section = validate(ServeSection, raw["serve"], prefix="serve")
    port = args.port if args.port is not None else section.port or 8000
    if section.in_process:
        print("serve: in_process plays the policy inside a run's own process; rollout serve deploys it on Serve",
              file=sys.stderr, flush=True)
    section = section.model_copy(update={"port": port, "keep": True, "in_process": False})
    address = args.address or os.environ.get("RAY_ADDRESS")
    farm = raw.get("farm") or {}
    assembly = FarmAssembly(section, model=raw.get("model"), address=address, num_cpus=farm.get("num_cpus"),
                            dashboard=bool(farm.get("dashboard")), backend=None)
    if assembly.reads_dataset and raw.get("dataset"):
        assembly.dataset = str(dataset_file(validate(DatasetConfig, raw["dataset"], prefix="dataset"), paths[0]))
    served = assembly.open_model()
    print(served.base_url, flush=True)
    if address or not assembly.deploys:
        return 0
    # Our own handlers: Ray's driver replaces Python's SIGINT handler, so Ctrl-C would not raise here.
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    print("serving until interrupted (Ctrl-C)", file=sys.stderr, flush=True)
    while not stop.wait(3600):
        pass
    print(f"serve: deleting {section.name!r}", file=sys.stderr, flush=True)
    assembly.stop_model()
    return 0


def models_main(argv: list[str]) -> int:
    parser = HelpParser(prog="rollout models", description="models for the CPU tier")
    sub = parser.add_subparsers(dest="command", required=True)
    tiny = sub.add_parser("tiny", help="write a tiny Qwen2-architecture model (random weights) to DIR")
    tiny.add_argument("dir", metavar="DIR")
    tiny.add_argument("--seed", type=int, default=0, help="seed of the random weights (default 0)")
    tiny.add_argument("--hidden", type=int, default=64, help="hidden size (default 64; head_dim stays 32)")
    tiny.add_argument("--layers", type=int, default=2, help="decoder layers (default 2)")
    args = parser.parse_args(argv)
    from cluster.serving.tiny_model import write_tiny_model

    t0 = time.perf_counter()
    path = write_tiny_model(args.dir, seed=args.seed, hidden=args.hidden, layers=args.layers)
    print(f"wrote {path} in {time.perf_counter() - t0:.1f}s", flush=True)
    return 0
