"""A job for tests/cards/test_contexts.py: top contexts on the tiny model, under torchrun or plain python.

    torchrun --standalone --nproc-per-node 2 tests/cards/contexts_job.py OUT_PREFIX

Every rank saves its result to ``OUT_PREFIX.rank<r>.pt`` (every rank must return the same).
"""

import dataclasses
import sys

import torch

from capinterp.arch.model import load_model
from capinterp.cards.contexts import top_contexts
from capinterp.core import distributed as dist

UNITS = [(0, 3), (1, 64), (2, 5), (3, 127), (3, 0)]


FIRST = ["Tokyo", "London", "Madrid", "Rome", "Berlin", "Question", "Options", "Python", "football", "mother"]
WORDS = [
    "the",
    "of",
    "capital",
    "is",
    "in",
    "city",
    "Paris",
    "Italy",
    "Germany",
    "1",
    "2",
    "3",
    "+",
    "=",
    "7",
    "Yes",
    "No",
    "answer",
    "correct",
]


def texts() -> list[str]:
    """Texts of many lengths (batches hold padding), each starting with its own word, so no two
    share a prefix and no two positions tie exactly."""
    g = torch.Generator().manual_seed(0)
    out = []
    for i, first in enumerate(FIRST):
        n = 2 + (7 * i) % 13
        out.append(" ".join([first] + [WORDS[j] for j in torch.randint(len(WORDS), (n,), generator=g).tolist()]))
    return out


def main(prefix: str) -> None:
    model = load_model("tiny", threads=1)
    world = dist.world_size() if dist.init() else 1
    res = top_contexts(model, UNITS, texts(), k=6, window=2, batch_size=3, progress=False)
    torch.save({"world": world, "units": [dataclasses.asdict(u) for u in res]}, f"{prefix}.rank{dist.rank()}.pt")
    dist.finish()


if __name__ == "__main__":
    main(sys.argv[1])
