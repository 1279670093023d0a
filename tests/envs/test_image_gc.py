"""The disk budget for per-instance images: least recently used removed first, never one a container
uses, one kept, or the base image; sizes parsed with clear errors; ``rollout images prune``.

Every prune here is limited (``match``) to images this test built, so no real instance image is touched."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from pydantic import ValidationError

from envs.images.image_gc import LABEL, list_instance_images, parse_size, prune_instance_images, record_use
from envs.swe.env import SweEnvironmentConfig

MB = 1_000_000
ROOT = Path(__file__).resolve().parents[2]


def present(tag: str) -> bool:
    return subprocess.run(["docker", "image", "inspect", tag], capture_output=True).returncode == 0


@pytest.fixture
def images(base_image, tmp_path):
    """``make(count, mb)``: tagged images ``FROM base`` with the instance label and ``mb`` MB of their own,
    and ``match`` for their tags. Every image and container made here is removed after the test."""
    prefix = f"rollout-farm/instance:gctest-{uuid.uuid4().hex[:10]}-"
    made: list[str] = []
    containers: list[str] = []

    def make(count: int, mb: int = 1) -> list[str]:
        tags = []
        for _ in range(count):
            tag = f"{prefix}{len(made)}"
            context = tmp_path / f"ctx{len(made)}"
            context.mkdir()
            (context / "blob").write_bytes(os.urandom(mb * MB))
            (context / "Dockerfile").write_text(f"FROM {base_image}\nLABEL {LABEL}=gctest\nCOPY blob /blob\n")
            made.append(tag)
            subprocess.run(["docker", "build", "-q", "-t", tag, str(context)], check=True, capture_output=True)
            tags.append(tag)
        return tags

    def container_of(tag: str) -> None:
        out = subprocess.run(["docker", "create", tag, "true"], check=True, capture_output=True, text=True)
        containers.append(out.stdout.strip())

    def match(tag: str) -> bool:
        return tag.startswith(prefix)

    make.container_of = container_of
    make.match = match
    try:
        yield make
    finally:
        if containers:
            subprocess.run(["docker", "rm", "-f", *containers], capture_output=True)
        if made:
            subprocess.run(["docker", "rmi", "-f", *made], capture_output=True)  # tags only: never the base image


def use_in_order(tags: list[str]) -> None:
    """Record uses oldest first, a second apart (well after the images were created)."""
    now = time.time()
    for i, tag in enumerate(tags):
        record_use(tag, now + 10 + i)


def test_least_recently_used_go_first_until_the_budget_is_met(images):
    a, b, c, d = images(4)
    sizes = {image.tags[0]: image.size for image in list_instance_images(match=images.match)}
    assert set(sizes) == {a, b, c, d} and all(MB <= size < 1.1 * MB for size in sizes.values())
    use_in_order([c, a, d, b])
    removed = prune_instance_images(int(2.5 * MB), match=images.match, log=lambda _: None)
    assert removed == [c, a]
    assert [present(t) for t in (a, b, c, d)] == [False, True, False, True]
    assert prune_instance_images(int(2.5 * MB), match=images.match, log=lambda _: None) == []  # within it now


def test_an_image_never_used_here_counts_as_used_when_it_was_created(images):
    old, recent, never = images(3)
    use_in_order([old, recent])  # both after ``never`` was created
    assert prune_instance_images(int(1.5 * MB), match=images.match, log=lambda _: None) == [never, old]
    assert present(recent)


def test_an_image_a_container_uses_is_kept_even_beyond_the_budget(images):
    used, free = images(2)
    use_in_order([used, free])
    images.container_of(used)  # created, never started
    said: list[str] = []
    assert prune_instance_images(0, match=images.match, log=said.append) == [free]
    assert present(used) and not present(free)
    assert "over the budget" in said[-1]


def test_kept_tags_stay_and_the_base_image_is_never_a_candidate(images, base_image):
    kept, other = images(2)
    use_in_order([kept, other])
    removed = prune_instance_images(0, keep={kept}, match=lambda t: images.match(t) or t == base_image,
                                    log=lambda _: None)
    assert removed == [other]
    assert present(kept) and present(base_image)


def test_a_dry_run_names_what_would_go_and_removes_nothing(images):
    a, b = images(2)
    use_in_order([a, b])
    said: list[str] = []
    assert prune_instance_images(int(1.5 * MB), match=images.match, dry_run=True, log=said.append) == [a]
    assert present(a) and present(b)
    assert any(line.startswith(f"would remove {a}") for line in said)


def test_sizes_parse_in_docker_units_and_bad_ones_are_named():
    assert parse_size("20G") == 20 * 10**9
    assert parse_size("500M") == 500 * MB
    assert parse_size("1.5GB") == 1_500_000_000
    assert parse_size("8GiB") == 8 * 2**30
    assert parse_size("1024") == parse_size(1024) == 1024
    for bad in ("20 gigs", "", "G", "-5M", "1.5.2G"):
        with pytest.raises(ValueError, match="not a size") as caught:
            parse_size(bad)
        assert repr(bad) in str(caught.value)
    with pytest.raises(ValueError, match="negative"):
        parse_size(-1)


def test_the_swe_config_checks_the_budget_when_it_loads():
    assert SweEnvironmentConfig(image_budget="20G").image_budget_bytes == 20 * 10**9
    assert SweEnvironmentConfig().image_budget_bytes is None
    with pytest.raises(ValidationError) as caught:
        SweEnvironmentConfig(image_budget="lots")
    assert "image_budget" in str(caught.value) and "'lots'" in str(caught.value)


def test_cli_dry_run_prints_a_summary(docker_available):
    done = subprocess.run([sys.executable, "-m", "cluster", "images", "prune", "--budget", "1T", "--dry-run"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "would remove 0 instance image(s)" in done.stdout and "1.0 TB budget" in done.stdout
