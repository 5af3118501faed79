"""The one record type every dataset, localizer and evaluation uses."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence


@dataclass(frozen=True)
class Example:
    """A prompt, the text the model should continue it with, and free-form metadata.

    ``target`` is the answer text *as it follows the prompt*: prompts end exactly where the
    answer starts (for digits, no trailing space), so ``prompt + target`` is the full text.
    ``meta`` records how the example was made (ops, format, language, answer, subject, ...).
    """

    prompt: str
    target: str
    meta: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self) -> None:
        if not isinstance(self.prompt, str) or not isinstance(self.target, str):
            raise TypeError("Example.prompt and Example.target must be strings")


def as_examples(items: Iterable[Any]) -> list[Example]:
    """Accept Examples, ``(prompt, target)`` pairs, or dicts with prompt/target keys.

    Plain strings are returned as Examples with an empty target; callers that allow them
    (e.g. KN, whose target is then the model's greedy next token) fill it in.
    """
    out: list[Example] = []
    for i, it in enumerate(items):
        if isinstance(it, Example):
            out.append(it)
        elif isinstance(it, str):
            out.append(Example(it, "", {"target_from": "greedy"}))
        elif isinstance(it, dict) and "prompt" in it and "target" in it:
            meta = {k: v for k, v in it.items() if k not in ("prompt", "target")}
            out.append(Example(str(it["prompt"]), str(it["target"]), meta))
        elif isinstance(it, Sequence) and len(it) == 2 and all(isinstance(x, str) for x in it):
            out.append(Example(it[0], it[1], {}))
        else:
            raise TypeError(
                f"item {i} is {type(it).__name__}; expected an Example, a (prompt, target) pair, "
                "a dict with 'prompt' and 'target', or a plain prompt string"
            )
    return out
