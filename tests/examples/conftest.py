"""What the example tests share: the RL example's smaller warm-started policy, made once a session (the RL loop's
tests and the TRL trainer's train it)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = str(Path(__file__).resolve().parents[2])
if ROOT not in sys.path:  # examples/ is not an installed package
    sys.path.insert(0, ROOT)


@pytest.fixture(scope="session")
def warm(vllm_available, tmp_path_factory):
    """A 0.19M-parameter policy (2 layers, 64 wide) after a short supervised warm start (about 40 s): it succeeds
    on about a third of its tasks, so most groups have rewards to compare."""
    from examples.rl_cpu.warm_start import warm_start

    out = tmp_path_factory.mktemp("rl") / "warm"
    warm_start(out, steps=800, seed=0, examples=1000, hidden=64, layers=2, intermediate=256, log=lambda *_: None)
    return out
