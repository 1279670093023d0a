"""RL on a CPU, the parts: a synthetic tool task family (``tasks``), the supervised warm start of a tiny
Qwen2-architecture policy (``warm_start``; its tokenizer and token streams in ``rendering``, its success rate in
``evaluate``) and the GRPO trainer math in torch (``grpo``).

Importing the package loads nothing heavy: ``tasks`` needs only the repository's own packages, the other two
import torch and transformers (the ``cpu-llm`` extra) when called.
"""
