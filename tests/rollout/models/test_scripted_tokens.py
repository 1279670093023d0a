"""The scripted models' fake tokenizer: the same text gives the same ids in any process, and what a process
tokenized decodes back to its text."""

from __future__ import annotations

import subprocess
import sys

from rollout.models import scripted_tokens


def test_a_reply_decodes_to_its_own_text_after_many_other_pieces():
    """A reply the server made before, then a diff's lines in a tool call's JSON (``\\nindex``, ...) and thousands of
    other pieces, then the same reply again (a cached tokenization): it decodes to its own text. With 50,000 ids,
    ``nindex`` and a backtick shared one, and the reply came back with ``nindex`` for its fence."""
    reply = "Turn 1.\n```bash\necho step 1\n```"
    scripted_tokens.token_ids(reply)
    scripted_tokens.token_ids('{"command": "cat > p <<EOF\\ndiff --git a/x b/x\\nindex 8b4fb9b..90bc92b 100644\\n"}')
    scripted_tokens.token_ids(" ".join(f"piece{i} word_{i * 7}" for i in range(20_000)))
    assert scripted_tokens.decode(scripted_tokens.token_ids(reply)) == reply
    assert "".join(scripted_tokens.token_text(t) for t in scripted_tokens.token_ids(reply)) == reply


def test_the_same_text_gives_the_same_ids_in_another_process():
    text = "Turn 2.\n```bash\ngit apply /tmp/p.patch\n```"
    other = subprocess.run([sys.executable, "-c", "from rollout.models import scripted_tokens as t; "
                            f"print(t.token_ids({text!r}))"], capture_output=True, text=True, check=True).stdout
    assert other.strip() == str(scripted_tokens.token_ids(text))
    assert all(100 <= t < 2**31 for t in scripted_tokens.token_ids(text))  # a 32-bit vocabulary's ids
