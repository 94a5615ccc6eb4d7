"""demos/averaging.py: seed 004's three running-mean forms agree with each other and with
attend()."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnlab import attend, build_mask
from attnlab.demos.averaging import AVERAGING_FORMS, average_loops


@settings(max_examples=30, deadline=None)
@given(B=st.integers(1, 4), T=st.integers(1, 12), C=st.integers(1, 5), seed=st.integers(0, 999))
def test_three_forms_agree(B: int, T: int, C: int, seed: int) -> None:
    x = torch.randn(B, T, C, generator=torch.Generator().manual_seed(seed))
    reference = average_loops(x)
    for name, form in AVERAGING_FORMS.items():
        torch.testing.assert_close(form(x), reference, atol=1e-6, rtol=0, msg=name)


def test_seed004_first_row_values() -> None:
    torch.manual_seed(1337)
    x = torch.randn(4, 8, 2)
    expected_first = torch.tensor([[0.1808, -0.0700], [-0.0894, -0.4926], [0.1490, -0.3199]])
    torch.testing.assert_close(average_loops(x)[0, :3], expected_first, atol=1e-4, rtol=0)


def test_equal_scores_in_attend_are_the_average() -> None:
    x = torch.randn(2, 6, 3)
    q = torch.zeros(2, 1, 6, 3)  # zero queries: every score is 0
    out = attend(q, q, x[:, None], build_mask(6, 6), fused=False)[:, 0]
    torch.testing.assert_close(out, average_loops(x), atol=1e-6, rtol=0)
