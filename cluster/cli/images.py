"""``rollout images base`` and ``rollout images build DATASET``: build the images rollouts run in, offline.
``--registry HOST:PORT/prefix`` (or ``ROLLOUT_REGISTRY``): push what was built (and found) there, so every node of a
farm pulls it (``images.registry``). ``rollout images prune --budget 20G``: remove the least recently used
per-instance images beyond a disk budget.

Exit codes: 0 done; 1 an image could not be built (each failure named) or docker failed; 2 bad arguments or dataset.
"""

from __future__ import annotations

import argparse
import os
import sys

from cluster.cli.parser import HelpParser, config_failure
from rollout.errors import ConfigError

REGISTRY_HELP = ("HOST:PORT/prefix to push the images to, for the nodes of a farm "
                 "(default $ROLLOUT_REGISTRY); credentials: ROLLOUT_REGISTRY_USERNAME/PASSWORD or docker login")


def build_parser() -> argparse.ArgumentParser:
    from envs.images.base_image import DEFAULT_BASE_IMAGE, DEFAULT_MIRROR

    parser = HelpParser(prog="rollout images", description="Build container images without a registry.")
    sub = parser.add_subparsers(dest="command", required=True)

    base = sub.add_parser("base", help="the base image: Debian + python3, pytest and git, from debootstrap (root)")
    base.add_argument("--tag", default=DEFAULT_BASE_IMAGE, help=f"image tag (default {DEFAULT_BASE_IMAGE})")
    base.add_argument("--force", action="store_true", help="rebuild even if the image exists")
    base.add_argument("--mirror", default=DEFAULT_MIRROR, help="Debian mirror to bootstrap from")
    base.add_argument("--suite", default="bookworm", help="Debian suite")
    base.add_argument("--workdir", default=None, help="where the temporary rootfs goes (default: the temp dir)")
    base.add_argument("--registry", default=os.environ.get("ROLLOUT_REGISTRY"), help=REGISTRY_HELP)

    build = sub.add_parser("build", help="an image per dataset row with repo_path: the repo at base_commit in "
                           "/testbed; or per Harbor task of a task directory, from its environment/")
    build.add_argument("dataset", help="JSONL or JSON dataset (repo_path is relative to this file), or a directory "
                       "of Harbor tasks")
    build.add_argument("--base", default=DEFAULT_BASE_IMAGE, help="image to build FROM (built first if it is the "
                       "default and missing)")
    build.add_argument("--parallel", type=int, default=2, help="builds at a time")
    build.add_argument("--force", action="store_true", help="rebuild images that exist, without the build cache")
    build.add_argument("--network", action="store_true", help="let install_cmd reach the network during the build")
    build.add_argument("--allow-outside-paths", action="store_true", help="let repo_path be absolute or lead out of "
                       "the dataset's directory (refused by default: a dataset must not reach any host path)")
    build.add_argument("--registry", default=os.environ.get("ROLLOUT_REGISTRY"), help=REGISTRY_HELP)

    prune = sub.add_parser("prune", help="remove the least recently used per-instance images beyond a disk budget "
                           "(never the base image, nor one a container uses)")
    prune.add_argument("--budget", required=True, help="disk the per-instance images may take, e.g. 20G, 500M")
    prune.add_argument("--dry-run", action="store_true", help="print what would be removed, remove nothing")
    return parser


def cmd_base(args: argparse.Namespace) -> int:
    from envs.images.base_image import build_base_image

    registry = _registry(args.registry)
    build_base_image(args.tag, mirror=args.mirror, suite=args.suite, force=args.force, workdir=args.workdir)
    if registry is not None:
        _push(registry, [args.tag])
    return 0


def _registry(prefix: str | None) -> object:
    """The registry to push to, checked (address and credentials) before anything is built; None without one."""
    if not prefix:
        return None
    from envs.images.registry import RegistrySource, check_registry, registry_problem

    if registry_problem(prefix):
        raise ConfigError(registry_problem(prefix), "--registry")
    check_registry(prefix, field="--registry")
    return RegistrySource(prefix)


def _push(registry: object, images: list[str]) -> None:
    from envs.images.daemon import docker_client

    client = docker_client()
    for image in images:
        registry.push(image, client)


def cmd_build(args: argparse.Namespace) -> int:
    from envs.images.base_image import ensure_image
    from envs.images.instance_images import build_instance_images
    from rollout.data.dataset import load_tasks

    if args.parallel < 1:
        raise ConfigError(f"must be at least 1, got {args.parallel}", "--parallel")
    if os.path.isdir(args.dataset):
        return _build_harbor(args)
    from envs.swe.env import check_grading_fields

    # a bad dataset is exit 2, before a minute goes into the base image
    tasks = load_tasks(args.dataset, check_grading_fields, allow_outside_paths=args.allow_outside_paths)
    registry = _registry(args.registry)
    ensure_image(args.base)
    report = build_instance_images(args.dataset, base=args.base, parallelism=args.parallel, force=args.force,
                                   network=args.network, allow_outside_paths=args.allow_outside_paths)
    print(f"built {len(report.built)}, skipped {len(report.skipped)} (present), failed {len(report.failed)}"
          + (f"; {len(report.ignored)} rows name their own image or have no repo_path" if report.ignored else ""))
    for ident, error in report.failed:
        print(f"failed: {ident}: {error}", file=sys.stderr)
    if registry is not None:
        from envs.images.image_names import image_for

        done = set(report.built) | set(report.skipped)
        _push(registry, [args.base] + [image_for(t, args.base) for t in tasks if t.task_id in done])
    return 1 if report.failed else 0


def _build_harbor(args: argparse.Namespace) -> int:
    from envs.harbor.dataset import load_harbor_tasks
    from envs.harbor.images import build_task_images

    tasks = load_harbor_tasks(args.dataset)  # a bad task is exit 2, before any build
    registry = _registry(args.registry)
    images, failed = build_task_images(tasks, parallel=args.parallel, force=args.force,
                                       log=lambda line: print(line, flush=True))
    print(f"{len(images)} of {len(tasks)} task images ready, {len(failed)} failed")
    for ident, error in failed:
        print(f"failed: {ident}: {error}", file=sys.stderr)
    if registry is not None:
        _push(registry, sorted(set(images)))
    return 1 if failed else 0


def cmd_prune(args: argparse.Namespace) -> int:
    from envs.images.image_gc import format_size, list_instance_images, parse_size, prune_instance_images

    try:
        budget = parse_size(args.budget)
    except ValueError as exc:
        raise ConfigError(str(exc), "--budget") from None
    removed = prune_instance_images(budget, dry_run=args.dry_run)
    left = list_instance_images()
    if args.dry_run:  # nothing was removed: what stays is what is listed minus what would go
        left = [image for image in left if not set(image.tags) & set(removed)]
    verb = "would remove" if args.dry_run else "removed"
    print(f"{verb} {len(removed)} instance image(s); {len(left)} left, taking "
          f"{format_size(sum(image.size for image in left))} of the {format_size(budget)} budget")
    return 0


COMMANDS = {"base": cmd_base, "build": cmd_build, "prune": cmd_prune}


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:  # argparse exits on --help (0) and on bad arguments (2); return the code instead
        return int(exc.code or 0)
    from envs.images.daemon import ImageError

    try:
        return COMMANDS[args.command](args)
    except ConfigError as exc:
        return config_failure(exc)
    except ImageError as exc:
        print(f"image error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
