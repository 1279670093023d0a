"""Small step environments (reset/step games) for demos and tests."""

from __future__ import annotations

from rollout.records import Task


class GuessNumber:
    """Guess the number in ``task.data["target"]`` (1..``task.data["high"]``, default 10).

    ``step("guess 7")`` answers higher / lower; the right guess pays ``1.0`` and ends the game, a
    wrong one costs ``-0.1``; ``max_guesses`` (default 6) wrong guesses end it too.
    """

    def __init__(self, task: Task):
        self.target = int(task.data["target"])
        self.high = int(task.data.get("high", 10))
        self.max_guesses = int(task.data.get("max_guesses", 6))
        self.guesses = 0

    def reset(self) -> str:
        self.guesses = 0
        return f"I picked a whole number between 1 and {self.high}. Guess it with the guess action."

    def step(self, action: str) -> tuple[str, float, bool, dict]:
        words = action.split()
        try:
            guess = int(words[-1])
        except (IndexError, ValueError):
            return f"'{action}' is not a guess; say e.g. 'guess 5'.", 0.0, False, {"valid": False}
        self.guesses += 1
        if guess == self.target:
            return f"{guess} is right!", 1.0, True, {"guesses": self.guesses}
        hint = "higher" if guess < self.target else "lower"
        done = self.guesses >= self.max_guesses
        return f"{guess} is wrong; the number is {hint}.", -0.1, done, {"guesses": self.guesses}
