"""TRL's GRPOTrainer on the farm, the parts: ``rollout`` (the trainer's ``rollout_func``: the trainer's weights
loaded into the farm's engine before each generation, the groups run by ``RolloutFarm.generate`` in token-in mode,
their token ids, logprobs and loss masks handed to TRL exactly as sampled, and the farm's verifier's reward as TRL's
reward function) and ``trainer`` (the ``GRPOConfig`` and ``GRPOTrainer`` built around it, and the dataset of the
RL example's training problems). ``examples/trl_grpo.py`` is the command.

The policy, tasks, warm start, serving and held-out evaluation are the RL example's (``examples.rl_cpu``). Importing
the package loads nothing heavy: torch, transformers and trl (the ``cpu-llm`` extra) are imported when called.
"""
