"""A tiny Qwen2-architecture model for the CPU tier, made here in seconds: no model hub is needed.

A byte-level BPE tokenizer trained with ``tokenizers`` on a small built-in corpus (shell commands, code, chat
and tool-call text), a chat template with hermes-style tool calls (``<tool_call>{"name", "arguments"}</tool_call>``,
what vLLM's ``hermes`` tool parser reads), and a ``Qwen2ForCausalLM`` with random weights (hidden 64, 2 layers by
default), saved in Hugging Face format. vLLM serves it from the directory. Needs the ``cpu-llm`` extra (torch,
transformers).
"""

from __future__ import annotations

import json
from pathlib import Path

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>",
                  "<tool_response>", "</tool_response>"]

CHAT_TEMPLATE = (
    "{% if tools %}<|im_start|>system\n"
    "{% if messages[0].role == 'system' %}{{ messages[0].content }}\n\n{% endif %}"
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
    "{% for tool in tools %}{{ '\\n' }}{{ tool | tojson }}{% endfor %}{{ '\\n' }}</tools>\n\n"
    "For each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}"
    "\n</tool_call><|im_end|>\n"
    "{% elif messages[0].role == 'system' %}<|im_start|>system\n{{ messages[0].content }}<|im_end|>\n"
    "{% endif %}"
    "{% for message in messages %}"
    "{% if message.role == 'user' or (message.role == 'system' and not loop.first) %}"
    "<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n"
    "{% elif message.role == 'assistant' %}<|im_start|>assistant\n"
    "{% if message.content %}{{ message.content }}{% endif %}"
    "{% for call in message.tool_calls or [] %}"
    "{% if (loop.first and message.content) or not loop.first %}{{ '\\n' }}{% endif %}"
    "{% set fn = call.function if call.function is defined else call %}"
    "<tool_call>\n{\"name\": \"{{ fn.name }}\", \"arguments\": "
    "{% if fn.arguments is string %}{{ fn.arguments }}{% else %}{{ fn.arguments | tojson }}{% endif %}"
    "}\n</tool_call>{% endfor %}<|im_end|>\n"
    "{% elif message.role == 'tool' %}"
    "{% if loop.first or messages[loop.index0 - 1].role != 'tool' %}<|im_start|>user{% endif %}"
    "{{ '\\n' }}<tool_response>\n{{ message.content }}\n</tool_response>"
    "{% if loop.last or messages[loop.index0 + 1].role != 'tool' %}<|im_end|>\n{% endif %}"
    "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
"""Qwen2.5's hermes-style template, written out: the system prompt lists the tools, an assistant's tool calls are
``<tool_call>`` JSON blocks, tool results go back as ``<tool_response>`` blocks in a user turn."""

CORPUS = [
    "ls -la\ncat README.md\ngrep -rn 'def main' src/\npython -m pytest -q tests/\ngit diff\necho done",
    "def add(a, b):\n    return a + b\n\nclass Stack:\n    def push(self, item):\n        self.items.append(item)",
    "The answer is 42. Let me look at the file first, then run the tests and fix the failing one.",
    '{"name": "calculate", "arguments": {"expression": "(17 * 23) + 4"}}',
    '{"name": "search", "arguments": {"query": "lesson title", "limit": 3}}',
    "What is 12 + 30? I will use the calculator tool. The result is 42.",
    "Traceback (most recent call last):\n  File \"main.py\", line 3, in <module>\nValueError: bad input",
    "THOUGHT: I should inspect the repository.\n```bash\nfind . -name '*.py' | head\n```",
]


def train_tokenizer(vocab_size: int = 2048):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(CORPUS * 20, trainer=trainer)
    return tokenizer


def write_tiny_model(directory: str | Path, *, seed: int = 0, hidden: int = 64, layers: int = 2,
                     max_positions: int = 4096) -> Path:
    """Write tokenizer, chat template, config and random weights to ``directory``; return it."""
    import torch
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    out = Path(directory).expanduser().resolve()
    out.mkdir(parents=True, exist_ok=True)
    fast = PreTrainedTokenizerFast(tokenizer_object=train_tokenizer(), eos_token="<|im_end|>",
                                   pad_token="<|endoftext|>", bos_token=None, unk_token=None)
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)
    heads = max(1, hidden // 32)  # head_dim 32: the smallest the CPU attention kernels take
    config = Qwen2Config(
        vocab_size=len(fast), hidden_size=hidden, intermediate_size=hidden * 2, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=max(1, heads // 2), max_position_embeddings=max_positions,
        tie_word_embeddings=True, torch_dtype="float32", eos_token_id=fast.eos_token_id,
        pad_token_id=fast.pad_token_id, bos_token_id=fast.pad_token_id,
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    model.save_pretrained(out, safe_serialization=True)
    (out / "generation_config.json").write_text(json.dumps({"eos_token_id": fast.eos_token_id,
                                                              "pad_token_id": fast.pad_token_id}))
    return out
