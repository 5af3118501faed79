"""Factual-knowledge datasets as ``list[Example]``, read from a path the user gives.

Loaders (none downloads anything; point them at your copy of the data):

* :func:`load_known_facts` -- ROME's ``known_1000.json`` (causal tracing's "known facts");
* :func:`load_counterfact` -- CounterFact, flattened (EasyEdit / KnowledgeSpread layout) or
  ROME's original layout with ``requested_rewrite``;
* :func:`load_pararel_bags` -- the knowledge-neurons ParaRel bags (``data_11.json``): one list of
  paraphrased Examples per fact;
* :func:`load_jsonl` -- any JSON / JSONL / CSV file of records, given the prompt and target keys;
* :func:`builtin_facts` -- a dozen famous facts written for this package, so examples and tests
  run without any data folder;
* :func:`facts_known_by` -- keep the facts whose greedy next token is the target's first token.

Target spacing. An Example's ``target`` is the text that follows the prompt, so
``prompt + target`` is the full sentence. For facts that means a leading space: the prompt
``"The Eiffel Tower is located in the city of"`` has the target ``" Paris"``. Fact loaders
strip the object and prepend one space; a prompt that ends in spaces has them moved into the
target (``"... is "`` + ``"Paris"`` becomes ``"... is"`` + ``" Paris"``), because a trailing space
in the prompt would merge with the answer's first BPE token (:mod:`capinterp.core.tokens`).
``meta["subject"]`` is the subject string as it occurs in the prompt (needed by causal tracing);
``meta["object"]`` is the bare object.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from capinterp.core.example import Example

from .builtin import builtin_facts, facts_known_by
from .io import PathLike, limit_records, need_keys, nonempty, read_json_any, records_of

__all__ = [
    "builtin_facts",
    "facts_known_by",
    "join_target",
    "load_counterfact",
    "load_jsonl",
    "load_known_facts",
    "load_pararel_bags",
]

# ----------------------------------------------------------------------------- helpers


def join_target(prompt: str, answer: str, space: bool | str = True) -> tuple[str, str]:
    """Return ``(prompt, target)`` with the answer spaced as a continuation of the prompt.

    ``space=True``: the target gets exactly one leading space (trailing spaces of the prompt are
    moved into it). ``space=False``: the answer is used as is (trailing prompt spaces are still
    moved). ``space="auto"``: a leading space is added unless the answer already starts with
    whitespace or the prompt ends with a newline, an opening bracket, a quote or one of ``=+-*/$``
    (so ``"2+3="`` + ``"5"`` stays unspaced, ``"Answer:"`` + ``"5"`` becomes ``" 5"``).
    """
    if space not in (True, False, "auto"):
        raise ValueError(f"space must be True, False or 'auto', got {space!r}")
    stripped = prompt.rstrip(" ")
    moved = len(prompt) - len(stripped)
    if space is True:
        return stripped, " " + answer.strip()
    if space is False or answer[:1].isspace():
        return stripped, " " * moved + answer if moved else answer
    if moved:
        return stripped, " " + answer.lstrip()
    last = stripped[-1:] if stripped else ""
    if not last or last in "\n\t([{\"'=+-*/$":
        return stripped, answer
    return stripped, " " + answer


# ----------------------------------------------------------------------------- ROME known facts


def load_known_facts(path: PathLike, *, limit: int | None = None) -> list[Example]:
    """ROME's ``known_1000.json``: ``prompt`` -> ``" " + attribute``.

    ``meta``: subject, object (= attribute), relation_id, known_id, template, prediction
    (the continuation of the model that built the set), source.
    """
    recs = records_of(read_json_any(path), path)
    out = []
    for i, r in enumerate(limit_records(recs, limit)):
        need_keys(r, ("prompt", "subject", "attribute"), i, path, "ROME known_1000")
        prompt, target = join_target(str(r["prompt"]), str(r["attribute"]))
        meta = {
            "subject": str(r["subject"]),
            "object": str(r["attribute"]).strip(),
            "relation_id": r.get("relation_id"),
            "known_id": r.get("known_id", i),
            "template": r.get("template"),
            "prediction": r.get("prediction"),
            "source": "known_1000",
        }
        out.append(Example(prompt, target, meta))
    return nonempty(out, path)


# ----------------------------------------------------------------------------- CounterFact


def load_counterfact(path: PathLike, *, target: str = "true", limit: int | None = None) -> list[Example]:
    """CounterFact facts: ``prompt`` -> ``" " + ground_truth`` (``target="true"``) or the new object.

    Accepts the flattened layout (``prompt, subject, ground_truth, target_new, rephrase_prompt,
    locality_prompt, locality_ground_truth``) and ROME's layout (``requested_rewrite`` with a
    ``{}`` prompt, ``target_true``/``target_new`` dicts, ``paraphrase_prompts``,
    ``neighborhood_prompts``). ``meta`` carries subject, ground_truth, target_new (both as
    targets with a leading space), relation_id, case_id, paraphrases (list of prompts; for the
    flattened layout the one ``rephrase_prompt``, also kept as ``rephrase_prompt``) and
    locality (list of ``{"prompt", "target"}`` neighbourhood pairs whose answer is the same
    true object for ROME's layout).
    """
    if target not in ("true", "new"):
        raise ValueError(f"target must be 'true' or 'new', got {target!r}")
    recs = records_of(read_json_any(path), path)
    out = []
    for i, r in enumerate(limit_records(recs, limit)):
        if isinstance(r, dict) and "requested_rewrite" in r:
            rr = r["requested_rewrite"]
            need_keys(rr, ("prompt", "subject", "target_true", "target_new"), i, path, "CounterFact requested_rewrite")
            subject = str(rr["subject"])
            prompt_raw = str(rr["prompt"]).replace("{}", subject)
            truth = _str_of(rr["target_true"])
            new = _str_of(rr["target_new"])
            paraphrases = [str(p) for p in r.get("paraphrase_prompts", [])]
            locality = [{"prompt": str(p), "target": " " + truth} for p in r.get("neighborhood_prompts", [])]
            relation = rr.get("relation_id")
        else:
            need_keys(r, ("prompt", "subject", "ground_truth", "target_new"), i, path, "CounterFact (flattened)")
            subject = str(r["subject"])
            prompt_raw = str(r["prompt"])
            truth, new = str(r["ground_truth"]), str(r["target_new"])
            paraphrases = [str(r["rephrase_prompt"])] if r.get("rephrase_prompt") else []
            locality = []
            if r.get("locality_prompt"):
                lp, lt = join_target(str(r["locality_prompt"]), str(r.get("locality_ground_truth", "")))
                locality.append({"prompt": lp, "target": lt})
            relation = r.get("relation_id")
        prompt, tgt = join_target(prompt_raw, truth if target == "true" else new)
        meta = {
            "subject": subject,
            "object": (truth if target == "true" else new).strip(),
            "ground_truth": " " + truth.strip(),
            "target_new": " " + new.strip(),
            "relation_id": relation,
            "case_id": r.get("case_id", i),
            "paraphrases": paraphrases,
            "locality": locality,
            "source": "counterfact",
        }
        if paraphrases and "requested_rewrite" not in r:
            meta["rephrase_prompt"] = paraphrases[0]
        out.append(Example(prompt, tgt, meta))
    return nonempty(out, path)


def _str_of(v: Any) -> str:
    return str(v["str"]) if isinstance(v, dict) and "str" in v else str(v)


# ----------------------------------------------------------------------------- ParaRel bags


def load_pararel_bags(
    path: PathLike, *, mask: str = "[MASK]", limit: int | None = None, min_prompts: int = 1
) -> list[list[Example]]:
    """Knowledge-neurons ParaRel facts (``data_11.json``) for left-to-right models.

    The file is a list of facts, each a list of ``[prompt with [MASK], object, relation]``.
    As in the GPT variant of KN, a prompt is kept only when the mask ends it (nothing but
    punctuation and spaces after it) and is truncated there: ``"Edmonton is the capital of
    [MASK]."`` becomes ``"Edmonton is the capital of"`` -> ``" Alberta"``. Facts left with fewer
    than ``min_prompts`` prompts are dropped.

    Returns one list per fact; its Examples share ``meta["fact_id"]`` (the fact's index in the
    file) and carry object, relation, paraphrase_index (index in the original bag), n_paraphrases,
    paraphrases (the other kept prompts of the fact) and subject. The subject is not stored in the
    file: it is inferred per relation as the part of the prompt that differs between facts at the
    same paraphrase index (word-aligned common prefix and suffix removed); it is ``None`` when that
    fails (e.g. a relation with a single fact).
    """
    doc = read_json_any(path)
    bags = records_of(doc, path)
    for i, bag in enumerate(bags[:5]):
        if not (isinstance(bag, list) and bag and isinstance(bag[0], (list, tuple)) and len(bag[0]) >= 3):
            raise ValueError(
                f"{path}: fact {i} is not a list of [prompt, object, relation] triples (knowledge-neurons data_11.json)"
            )
    templates = _pararel_templates(bags)
    out: list[list[Example]] = []
    for fid, bag in enumerate(bags):
        if limit is not None and len(out) >= limit:
            break
        facts: list[Example] = []
        for j, item in enumerate(bag):
            if not (isinstance(item, (list, tuple)) and len(item) >= 3):
                raise ValueError(f"{path}: fact {fid}, prompt {j} is not a [prompt, object, relation] triple")
            text, obj, rel = str(item[0]), str(item[1]), str(item[2])
            if text.count(mask) != 1:
                continue
            head, tail = text.split(mask)
            if tail.strip(" .!?;,") != "":
                continue  # the object is not the last thing: a left-to-right model cannot predict it
            prompt, target = join_target(head.rstrip(), obj)
            if not prompt:
                continue
            subject = _subject_from_template(text, templates.get((rel, j)))
            facts.append(
                Example(
                    prompt,
                    target,
                    {
                        "fact_id": fid,
                        "object": obj,
                        "relation": rel,
                        "relation_id": rel.split("(")[0],
                        "subject": subject if subject and subject in prompt else None,
                        "paraphrase_index": j,
                        "source": "pararel_kn",
                    },
                )
            )
        if len(facts) >= max(1, min_prompts):
            for ex in facts:
                ex.meta["n_paraphrases"] = len(facts)
                ex.meta["paraphrases"] = [o.prompt for o in facts if o is not ex]
            out.append(facts)
    return nonempty(out, path, f"(no fact has {min_prompts}+ prompts ending in {mask})")


def _pararel_templates(bags: list) -> dict[tuple[str, int], tuple[str, str]]:
    """(relation, paraphrase index) -> word-aligned (common prefix, common suffix) over facts."""
    groups: dict[tuple[str, int], list[str]] = {}
    for bag in bags:
        for j, item in enumerate(bag):
            if isinstance(item, (list, tuple)) and len(item) >= 3:
                groups.setdefault((str(item[2]), j), []).append(str(item[0]))
    out = {}
    for key, texts in groups.items():
        if len(set(texts)) < 2:
            continue
        pre = os.path.commonprefix(texts)
        suf = os.path.commonprefix([t[::-1] for t in texts])[::-1]
        while pre and pre[-1].isalnum():  # do not eat the start of a subject word
            pre = pre[:-1]
        while suf and suf[0].isalnum():
            suf = suf[1:]
        out[key] = (pre, suf)
    return out


def _subject_from_template(text: str, tpl: tuple[str, str] | None) -> str | None:
    if tpl is None:
        return None
    pre, suf = tpl
    if not (text.startswith(pre) and text.endswith(suf)) or len(pre) + len(suf) >= len(text):
        return None
    middle = text[len(pre) : len(text) - len(suf)]
    if "[MASK]" in middle:  # the mask sits between prefix and suffix: the subject is on one side
        return None
    middle = middle.strip(" ,.'")
    return middle or None


# ----------------------------------------------------------------------------- generic


def load_jsonl(
    path: PathLike,
    prompt_key: str | Callable[[dict], str] = "prompt",
    target_key: str | Callable[[dict], Any] = "target",
    *,
    space: bool | str = "auto",
    subject_key: str | None = "subject",
    limit: int | None = None,
) -> list[Example]:
    """Generic loader for JSON / JSONL / CSV records.

    Accepted shapes: JSON lines; a JSON list of objects; an object holding the list under a key
    such as ``data`` / ``examples`` / ``records`` (or its only list); an object of id -> record;
    a CSV file with a header row. ``prompt_key`` / ``target_key`` name the fields (or are
    callables ``record -> value``); a list-valued target (e.g. zsRE's ``answers``) uses its first
    element. Targets are spaced with :func:`join_target` (``space="auto"`` by default). Every other
    field of the record is kept in ``meta``; ``subject_key`` (when present in a record) is copied
    to ``meta["subject"]``.
    """
    recs = records_of(read_json_any(path), path)
    out = []
    for i, r in enumerate(limit_records(recs, limit)):
        keys = [k for k in (prompt_key, target_key) if isinstance(k, str)]
        need_keys(r, keys, i, path, f"records with {keys}")
        prompt = prompt_key(r) if callable(prompt_key) else r[prompt_key]
        target = target_key(r) if callable(target_key) else r[target_key]
        if isinstance(target, (list, tuple)):  # several gold answers: the first is the target
            if not target:
                raise ValueError(f"{path}: record {i} has an empty list under {target_key!r}")
            target = target[0]
        if prompt is None or target is None:
            raise ValueError(f"{path}: record {i} has a null prompt or target")
        p, t = join_target(str(prompt), str(target), space)
        meta = {k: v for k, v in r.items() if k not in keys or isinstance(v, (list, tuple))}
        if subject_key and subject_key in r:
            meta["subject"] = r[subject_key]
        meta.setdefault("source", Path(path).name)
        out.append(Example(p, t, meta))
    return nonempty(out, path)
