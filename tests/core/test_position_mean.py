"""SplitMean: means over real tokens, the first position apart from the later ones."""

import pytest
import torch

from capinterp.core.position_mean import SplitMean, at_positions, batch_rows


def test_split_mean_matches_a_loop_over_real_tokens_across_batches():
    g = torch.Generator().manual_seed(0)
    batches = [
        (torch.randn(3, 5, 4, generator=g), torch.tensor([5, 2, 1])),
        (torch.randn(2, 3, 4, generator=g), torch.tensor([3, 3])),
    ]
    acc = SplitMean()
    firsts, rest = [], []
    for v, lengths in batches:
        acc.add(v, lengths)
        for b, n in enumerate(lengths.tolist()):
            firsts.append(v[b, 0])
            rest += [v[b, t] for t in range(1, n)]  # padding (t >= n) never counts
    got = acc.result()
    assert got.shape == (2, 4)
    assert torch.allclose(got[0], torch.stack(firsts).mean(0), atol=1e-6)
    assert torch.allclose(got[1], torch.stack(rest).mean(0), atol=1e-6)
    assert at_positions(got, 4).tolist() == [got[0].tolist()] + [got[1].tolist()] * 3
    rows = batch_rows(got, 3, 4)
    assert rows.shape == (3, 4, 4) and all(torch.equal(r, at_positions(got, 4)) for r in rows)


def test_one_token_prompts_and_no_data():
    acc = SplitMean()
    acc.add(torch.ones(2, 1, 3), torch.tensor([1, 1]))
    assert torch.equal(acc.result(), torch.ones(2, 3))  # no later position: the first mean stands in
    with pytest.raises(ValueError, match="at least one token"):
        SplitMean().result()
