# examples/agents/my_env.py -- run from the directory that holds it:
#   rlvr train --hf-checkpoint MODEL --prompt-data PROMPTS --apply-chat-template --environment-path my_env:make_env --max-turns 3
import re


class GuessTheNumber:
    """The model guesses a number from 1 to 9; the environment says higher or lower."""

    def reset(self, sample):
        label = str(sample.label)
        self.target = int(label) % 9 + 1 if label.isdigit() else 5
        self.guesses = 0
        return [{"role": "user", "content": "Guess my number from 1 to 9. Answer with the number only."}]

    def step(self, response):
        self.guesses += 1
        m = re.search(r"\d+", response)
        if m is None:
            return "Answer with a number.", 0.0, False
        guess = int(m.group())
        if guess == self.target:
            return "Right.", 1.0 / self.guesses, True
        return ("Higher." if guess < self.target else "Lower."), 0.0, False


def make_env():
    return GuessTheNumber()
