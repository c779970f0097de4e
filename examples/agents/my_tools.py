# examples/agents/my_tools.py -- run from the directory that holds it:
#   rlvr train --hf-checkpoint MODEL --prompt-data PROMPTS --apply-chat-template --tools my_tools:TOOLS --max-turns 3 --tool-timeout 5
import time


def multiply(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: the first factor
        b: the second factor
    """
    return a * b


def lookup(key: str) -> str:
    """Look a key up in a slow service.

    Args:
        key: what to look up
    """
    time.sleep(0.1)  # a plain blocking call: it runs on its own thread, abandoned at --tool-timeout
    return {"pi": "3.14159", "e": "2.71828"}.get(key, "unknown key")


TOOLS = [multiply, lookup]
