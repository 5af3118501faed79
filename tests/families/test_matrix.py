"""Every family x every method against its plain-transformers reference; the docs table is current."""

from __future__ import annotations

import pytest

from capinterp.testing.family_checks import FAMILIES, all_checks, run_check
from capinterp.testing.family_checks.table import render

CHECKS = all_checks()
# attention heads routed per token (JetMoE's mixture of attention heads): no head is a fixed graph node
ROUTED_HEADS, ROUTED_HEADS_REFUSED = {"jetmoe"}, {"eap", "eap_ig", "acdc"}
# several residual streams (DeepSeek-V4's hyper-connections; Gemma 3n's AltUp streams, which each layer
# predicts, runs on one of and corrects): the circuit graph's split of the residual stream does not hold
# (Gemma 4's per-layer embeddings are graph nodes, its layer scales carried)
LAYER_EXTRAS, LAYER_EXTRAS_REFUSED = {"deepseek_v4", "gemma3n_text"}, {"eap", "eap_ig", "acdc"}
# latent experts (Nemotron 3 Super): a routed value vector is fc2 @ the expert's column, so edits that write
# new d_model value vectors there refuse (ROME's check edits a routed expert; the shared one is tested apart)
LATENT, LATENT_REFUSED = {"nemotron_h_latent"}, {"edit_knowledge", "rome_edit"}
_seen: dict[tuple[str, str], str] = {}


@pytest.mark.parametrize("method", list(CHECKS))
@pytest.mark.parametrize("family", FAMILIES)
def test_method_on_family(family, method):
    result = run_check(method, family)  # a wrong number raises; only refusals and passes return
    _seen[family, method] = result
    refusals = (
        (ROUTED_HEADS_REFUSED if family in ROUTED_HEADS else set())
        | (LAYER_EXTRAS_REFUSED if family in LAYER_EXTRAS else set())
        | (LATENT_REFUSED if family in LATENT else set())
    )
    if method not in refusals:
        assert result == "Y", f"family {family} refused for {method}: {result}"
    else:
        assert result.startswith("refused: "), result


def test_docs_matrix_is_current():
    """docs/models.md shows exactly what the checks above produced (regenerate: scripts/gen_family_table.py)."""
    from pathlib import Path

    from capinterp.testing.family_checks.table import BEGIN, END

    if len(_seen) < len(FAMILIES) * len(CHECKS):
        pytest.skip("only part of the matrix ran in this session")
    ordered = {(f, m): _seen[f, m] for f in FAMILIES for m in CHECKS}
    doc = (Path(__file__).resolve().parents[2] / "docs" / "models.md").read_text()
    block = doc.split(BEGIN, 1)[1].split(END, 1)[0].strip("\n")
    assert block == render(ordered).strip("\n"), (
        "docs/models.md's family matrix is stale: run scripts/gen_family_table.py"
    )
