"""A toy training loop over the farm: a few steps of group sampling, GRPO advantages from the farm's rewards, the
per-sample token data a trainer consumes, and a new policy version each step (a real trainer would update and
reload weights where this one only advances the version).

    python examples/train_loop.py                # an embedded Ray cluster (configs/train.yaml)
    python examples/train_loop.py --local        # one process, no Ray
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def tasks() -> list[dict]:
    """Rows as a dataset file has them: the seed's parity decides the reward, so a group of 4 is mixed."""
    return [{"task_id": f"parity-{k}", "prompt": f"Record your seed (task {k}).",
             "check": f"test $(( $(cat seed.txt) % 2 )) -eq {k % 2}"} for k in range(4)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--local", action="store_true", help="run rollouts in this process (no Ray)")
    args = parser.parse_args()
    from cluster import RolloutFarm

    options = {"backend": "local"} if args.local else {}
    with RolloutFarm.from_config(ROOT / "configs" / "train.yaml", **options) as farm:
        for step in range(args.steps):
            batch = farm.generate(tasks(), n=4, sampling={"temperature": 1.0}, max_staleness=0)
            samples = batch.samples()
            rewards = [s.reward for s in samples]
            print(f"step {step}: {batch.describe()}; mean reward {sum(rewards) / max(1, len(rewards)):.2f}")
            for s in samples[:4]:
                model_tokens = sum(s.loss_mask)
                print(f"  {s.rollout_id}: reward {s.reward:.0f} advantage {s.advantage:+.2f} "
                      f"prompt {len(s.prompt_ids)} ids {s.prompt_ids[:4]}... response {len(s.response_ids)} ids "
                      f"mask {model_tokens}/{len(s.loss_mask)} model tokens, version {s.policy_versions[0]}")
            arrays = batch.padded()
            print(f"  padded: prompt_ids {arrays['prompt_ids'].shape} response_ids {arrays['response_ids'].shape}")
            farm.set_policy_version(step + 1)  # a trainer: update the weights, reload them, then this
    return 0


if __name__ == "__main__":
    sys.exit(main())
