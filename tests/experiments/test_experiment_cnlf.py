"""The CNLF experiment (papers/003 Table 6) on the tiny model, quick mode."""

import json

import pandas as pd
import torch

from capinterp.experiments import EXPERIMENTS, Context, ExperimentResult
from capinterp.experiments.cnlf import FULL, PAPER, QUICK, cnlf, cnlf_data, run


def test_data_split_is_disjoint_and_generalization_sets_mix_operators():
    train, sets = cnlf_data(FULL, seed=0)
    assert list(sets) == ["+", "+&-", "+&*", "+&/"]
    assert len(train) == FULL.n_train and len(sets["+"]) == FULL.n_fit
    seen = {e.meta["expression"] for e in train}
    assert not seen & {e.meta["expression"] for e in sets["+"]}
    for name in ("+&-", "+&*", "+&/"):
        assert all(e.meta["n_ops"] == 2 and set(e.meta["ops"]) == {"+", name[-1]} for e in sets[name])


def test_quick_run_on_tiny(tiny, tmp_path):
    assert "cnlf" in EXPERIMENTS and EXPERIMENTS["cnlf"][1] is run
    before = {n: p.detach().clone() for n, p in tiny.named_parameters()}
    res = cnlf(Context(tiny, quick=True, seed=0), lr=1e-3, lr_full=1e-3)
    t = res.table
    assert isinstance(res, ExperimentResult) and res.name == "cnlf"
    assert list(t["method"]) == ["original", "located", "random", "full"]
    for col in ("paper_name", "n_neurons", "n_trainable_params", "param_share", "train_loss", "+", "+&*", "gen_avg"):
        assert col in t.columns, col
    assert len(t) == 4 and t[["+", "+&*"]].apply(lambda c: c.between(0, 100)).all().all()
    rows = t.set_index("method")
    # equal budgets for the located and random arms; the full arm trains everything
    assert rows.loc["located", "n_trainable_params"] == rows.loc["random", "n_trainable_params"] > 0
    assert (
        rows.loc["located", "n_neurons"]
        == rows.loc["random", "n_neurons"]
        == res.info["n_neurons"]
        >= QUICK.min_neurons
    )
    assert rows.loc["full", "param_share"] == 1.0 > rows.loc["located", "param_share"]
    assert res.neurons["located"] != res.neurons["random"]
    # training lowers the training loss (lr 1e-3, one step on the tiny model)
    assert rows.loc["full", "train_loss"] < rows.loc["original", "train_loss"]
    assert rows.loc["located", "train_loss"] < rows.loc["original", "train_loss"]
    for name, p in tiny.named_parameters():  # the shared model is untouched
        assert torch.equal(p, before[name]), name
    assert PAPER["table6_plus"]["LLaMA-2-7B"]["Ours"][0] == res.info["paper"]["table6_plus"]["LLaMA-2-7B"]["Ours"][0]
    json.dumps(res.info, default=str)
    back = ExperimentResult.load(res.save(tmp_path).parent, "cnlf")
    pd.testing.assert_frame_equal(back.table, t, check_dtype=False)
    assert len(res.figure.data) == 4


def test_without_located_arm_adds_the_erased_row(tiny):
    res = cnlf(Context(tiny, quick=True), arms=("located", "without_located"), lr=1e-3, gen_ops="")
    assert list(res.table["method"]) == ["original", "erased", "located", "without_located"]
    assert list(res.info["sets"]) == ["+"]
