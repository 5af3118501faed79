"""The one record type every dataset, localizer and evaluation uses."""

from __future__ import annotations

import unicodedata
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Example", "TokenizationError", "as_examples", "check_target", "glued_words", "spaced_target"]


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

    @property
    def wants_greedy(self) -> bool:
        """True for a bare prompt (no target given): the model's greedy next token becomes the target."""
        return not self.target and self.meta.get("target_from") == "greedy"


class TokenizationError(ValueError):
    """An example cannot be scored as written: an empty or whitespace-only target, a target that
    does not tokenize as separate tokens after its prompt, a prompt ending in whitespace that the
    target's first token would absorb, a subject off the token boundaries, or a text longer than
    the model's context."""


#: Scripts written without spaces between words: a prompt and target there join without a space.
_UNSPACED = ("CJK", "HIRAGANA", "KATAKANA", "THAI", "LAO", "KHMER", "MYANMAR", "TIBETAN", "IDEOGRAPHIC", "YI ")


def _spaced_word_char(ch: str) -> bool:
    """A letter or digit of a script that separates words by spaces (not CJK, Thai, ...)."""
    if not ch.isalnum():
        return False
    name = unicodedata.name(ch, "")
    return not name.startswith(_UNSPACED)


def glued_words(prompt: str, target: str) -> bool:
    """Whether ``prompt + target`` glues two words into one: the prompt ends in a letter or digit
    and the target starts with one (``"The capital of Germany is"`` + ``"Berlin"`` reads
    ``"isBerlin"``), in a script whose words are separated by spaces. Such a target is scored as a
    token no real text has there (p 7e-06 instead of 0.80 for ``" Berlin"`` on SmolLM2), so
    :func:`check_target` refuses it and shows the fix, :func:`spaced_target`. Arithmetic such as
    ``"3+4="`` + ``"7"`` and unspaced scripts (``"中国的首都是"`` + ``"北京"``) are not glued."""
    return bool(prompt) and bool(target) and _spaced_word_char(prompt[-1]) and _spaced_word_char(target[0])


def spaced_target(target: str) -> str:
    """The fix for a glued target: the same answer with one leading space (``"Berlin"`` -> ``" Berlin"``)."""
    return " " + target


def check_target(ex: Example, index: int) -> None:
    """The one rule for targets, applied by every entry point (:func:`as_examples` and
    :func:`capinterp.core.tokens.encode`, so lists, tuples, DataFrames, loaders, the CLI, every
    localizer, ``evaluate``, ``faithfulness`` and the editors alike).

    - An explicit target must hold more than whitespace. Only a bare prompt (a plain string, a dict
      without ``target``, or an Example whose ``meta["target_from"] == "greedy"``) may have an
      empty target: it asks for the model's greedy next token. Anything else with an empty or
      whitespace-only target (``("3+4=", "")``, ``("3+4=", " ")``) is a :class:`TokenizationError`.
    - A target must not glue onto the prompt's last word (:func:`glued_words`):
      ``("... Germany is", "Berlin")`` is a :class:`TokenizationError` that shows the fix, target
      ``" Berlin"``. The data loaders (:mod:`capinterp.data`) space their targets by
      :func:`capinterp.data.facts.join_target`, whose ``"auto"`` rule never glues.
    """
    if ex.meta.get("target_from") == "greedy":  # requested or filled in: the model's own token
        return
    if not ex.target.strip():
        what = "an empty target" if not ex.target else f"an empty target (whitespace only: {ex.target!r})"
        raise TokenizationError(
            f"example {index} has {what} after prompt {ex.prompt[-40:]!r}; give the answer text (only a bare "
            "prompt string, where a localizer takes one, means the model's greedy next token)"
        )
    if glued_words(ex.prompt, ex.target):
        raise TokenizationError(
            f"example {index}: target {ex.target!r} glues onto the prompt's last word "
            f"({(ex.prompt[-20:] + ex.target[:12])!r}), so the model would be scored on a token no real "
            f"text has there. Start the target with its space: target {spaced_target(ex.target)!r}."
        )


def as_examples(items: Iterable[Any]) -> list[Example]:
    """Accept Examples, ``(prompt, target)`` pairs, dicts with prompt/target keys, or a DataFrame.

    A DataFrame needs a ``prompt`` column; ``target`` is optional (empty when missing) and every
    other column goes to ``meta``. Plain strings (and dicts without ``target``) are returned as
    Examples with an empty target and ``meta["target_from"] = "greedy"``; callers that allow them
    (the localizers) fill in the model's greedy next token. A bare string, bytes, a mapping or a
    single Example is refused (it would be iterated as characters / keys), and so is an empty
    prompt; an explicit empty or whitespace-only target is a :class:`TokenizationError`
    (:func:`check_target`); errors name the item's index.
    """
    if isinstance(items, (str, bytes, bytearray, Example, Mapping)):
        raise TypeError(
            f"expected a list of examples, got a single {type(items).__name__} ({items!r:.60}); "
            "wrap it in a list: [...]"
        )
    if hasattr(items, "columns") and hasattr(items, "to_dict"):  # a pandas DataFrame
        if "prompt" not in items.columns:
            raise ValueError(f"a DataFrame of examples needs a 'prompt' column, got columns {list(items.columns)}")
        items = items.to_dict(orient="records")
    if not isinstance(items, Iterable):
        raise TypeError(f"expected a list of examples, got {type(items).__name__}")
    out: list[Example] = []
    for i, it in enumerate(items):
        if isinstance(it, Example):
            ex = it
        elif isinstance(it, str):
            ex = Example(it, "", {"target_from": "greedy"})
        elif isinstance(it, Mapping) and "prompt" in it:
            target = it.get("target", "")
            if not isinstance(it["prompt"], str) or not isinstance(target, str):
                raise TypeError(
                    f"item {i}: prompt and target must be strings, got "
                    f"{type(it['prompt']).__name__} and {type(target).__name__}"
                )
            meta = {k: v for k, v in it.items() if k not in ("prompt", "target")}
            ex = Example(it["prompt"], target, meta if "target" in it else {**meta, "target_from": "greedy"})
        elif isinstance(it, Sequence) and len(it) == 2 and all(isinstance(x, str) for x in it):
            ex = Example(it[0], it[1], {})
        else:
            raise TypeError(
                f"item {i} is {type(it).__name__} ({it!r:.60}); expected an Example, a (prompt, target) pair "
                "of strings, a dict with 'prompt' (and 'target'), or a plain prompt string"
            )
        if not ex.prompt:
            raise ValueError(f"item {i} has an empty prompt (target {ex.target!r:.40}); every example needs a prompt")
        check_target(ex, i)
        out.append(ex)
    return out
