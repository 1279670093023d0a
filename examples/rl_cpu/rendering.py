"""The warm start's rendering: the tokenizer (byte-level BPE with ``cluster.serving.tiny_model``'s special tokens and
chat template, single-digit number tokens, the tool tags as non-special added tokens), the synthetic trajectories
of ``examples.rl_cpu.tasks``, and their token ids with a loss mask on the model's completions, built the way the
token-in client builds a stream (``rollout.models.client.token_in``)."""

from __future__ import annotations

import functools
import json
import random
from typing import Any

from examples.rl_cpu import tasks as T
from rollout.records import Message

TOOL_TAGS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]
ANSWER = "The answer is {}."


def _tokenizer(texts: list[str], vocab_size: int):
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from cluster.serving.tiny_model import CHAT_TEMPLATE, SPECIAL_TOKENS

    special = [t for t in SPECIAL_TOKENS if t not in TOOL_TAGS]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=special, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer=trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in SPECIAL_TOKENS if t in TOOL_TAGS])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   bos_token=None, unk_token=None)
    fast.chat_template = CHAT_TEMPLATE
    return fast


def build_tokenizer(seed: int = 0, vocab_size: int = 1024):
    """The tokenizer: trained on this family's conversations rendered by the chat template (two passes: a
    bootstrap tokenizer renders the text, the final one is trained on it)."""
    rng = random.Random(seed)
    convs = [trajectory(row, rng, guess=0.3) for row in T.make_tasks(400, seed, "train", unique=False)]
    boot = _tokenizer(["x"], 300)
    tools = T.tool_schemas()
    texts = [boot.apply_chat_template(c, tools=tools, tokenize=False) for c in convs]
    texts += [json.dumps(t) for t in tools] + ["Tool 'x' not found", "Invalid arguments for tool 'x': ",
                                               "Tool execution error: no price for 'x'"]
    return _tokenizer(texts, vocab_size)


def trajectory(row: dict[str, Any], rng: random.Random, guess: float = 0.0) -> list[Message]:
    """A conversation for one row: the solution's tool calls, their real outputs, then the answer; or, with
    probability ``guess``, a direct answer near the right one (right by chance now and then)."""
    task = T.as_task(row)
    messages: list[Message] = [{"role": "user", "content": row["prompt"]}]
    if rng.random() < guess:
        answer = row["data"]["answer"] + rng.choice([-10, -2, -1, 1, 2, 10, 0])
        return messages + [{"role": "assistant", "content": ANSWER.format(answer)}]
    tools = T.tools_for(task)
    for n, (name, args) in enumerate(row["data"]["solution"]):
        _ok, output = tools.execute_tool(name, **args)
        messages += [T.call_message(name, args, n), {"role": "tool", "tool_call_id": f"call_{n}", "content": output}]
    return messages + [{"role": "assistant", "content": ANSWER.format(row["data"]["answer"])}]


def render(tok, messages: list[Message], tools: list | None, generation_prompt: bool) -> list[int]:
    ids = tok.apply_chat_template(messages, tools=tools or None, tokenize=True,
                                  add_generation_prompt=generation_prompt, return_dict=False)
    return list(ids["input_ids"] if isinstance(ids, dict) else ids)


@functools.lru_cache(maxsize=8)
def end_of_turn(tok) -> tuple[int, ...]:
    """The template's tokens after an assistant message's content (``<|im_end|>`` ``\\n``), found the way the
    client finds them."""
    user = [{"role": "user", "content": "a"}]
    with_reply = render(tok, user + [{"role": "assistant", "content": "b"}], None, False)
    return tuple(with_reply[len(render(tok, user, None, True)) + len(tok.encode("b")):])


def delta(tok, before: list[Message], after: list[Message], tools: list | None, stopped: bool = True) -> list[int]:
    """The ids a token-in stream adds after a completion: the rest of the end of turn, then the new messages
    and the generation prompt (the conversation with them minus the conversation without them)."""
    upto, full = render(tok, before, tools, False), render(tok, after, tools, True)
    return _delta(tok, upto, full, stopped)


def _delta(tok, upto: list[int], full: list[int], stopped: bool = True) -> list[int]:
    if full[: len(upto)] != upto:
        raise ValueError("the template does not render this conversation append-only")
    return list(end_of_turn(tok)[1 if stopped else 0:]) + full[len(upto):]


def encode(tok, messages: list[Message], tools: list | None) -> tuple[list[int], list[int]]:
    """One conversation as a token-in stream: ``(ids, loss_mask)``, the mask 1 on the completions' tokens."""
    rendered: dict[tuple[int, bool], list[int]] = {}

    def upto(k: int, generation_prompt: bool) -> list[int]:
        if (k, generation_prompt) not in rendered:
            rendered[k, generation_prompt] = render(tok, messages[:k], tools, generation_prompt)
        return rendered[k, generation_prompt]

    turns = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    ids = list(upto(turns[0], True))
    mask = [0] * len(ids)
    tail = len(end_of_turn(tok))
    for n, i in enumerate(turns):
        if n:
            added = _delta(tok, upto(turns[n - 1] + 1, False), upto(i, True))
            ids, mask = ids + added, mask + [0] * len(added)
        prompt, reply = upto(i, True), upto(i + 1, False)
        completion = reply[len(prompt): len(reply) - tail + 1]  # through <|im_end|>
        ids, mask = ids + completion, mask + [1] * len(completion)
    return ids, mask
