"""attnformal.npu on concrete integers: the documented modes, the mapping, the rejected masks."""

import itertools

import pytest
import torch

from attnformal.masks import MaskGeometry, may_attend
from attnformal.npu import INT_MAX, npu_atten_mask, npu_keeps, npu_mask_args


def keeps(g, i, j, **kwargs):
    mode, pre, following = npu_mask_args(g)
    return npu_keeps(i, j, sparse_mode=mode, pre_tokens=pre, next_tokens=following, len_q=g.len_q,
                     len_k=g.len_k, **kwargs)


@pytest.mark.parametrize("len_q, len_k", [(1, 1), (3, 7), (7, 3), (5, 5), (0, 4)])
def test_mapping_equals_may_attend_on_small_grids(len_q, len_k):
    for causal, window in itertools.product((None, "bottom_right"), (None, (1, 2), (0, -1), (-1, 0))):
        g = MaskGeometry(len_q, len_k, causal, window)
        for i, j in itertools.product(range(-1, len_q + 1), range(-1, len_k + 1)):
            assert bool(keeps(g, i, j)) == bool(may_attend(i, j, g)), (g, i, j)


def test_documented_modes_on_a_3x5_grid():
    def grid(mode, pre=INT_MAX, following=INT_MAX):
        return [[int(npu_keeps(i, j, sparse_mode=mode, pre_tokens=pre, next_tokens=following, len_q=3, len_k=5))
                 for j in range(5)] for i in range(3)]

    assert grid(2) == [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0]]  # leftUpCausal
    assert grid(3) == [[1, 1, 1, 0, 0], [1, 1, 1, 1, 0], [1, 1, 1, 1, 1]]  # rightDownCausal
    assert grid(4, 1, 0) == [[0, 1, 1, 0, 0], [0, 0, 1, 1, 0], [0, 0, 0, 1, 1]]  # band from the lower right


def test_atten_mask_true_means_masked_out():
    allowed = torch.tensor([[True, False]])
    atten_mask = npu_atten_mask(allowed)
    assert atten_mask.tolist() == [[False, True]]
    kept = [bool(npu_keeps(0, j, sparse_mode=1, pre_tokens=INT_MAX, next_tokens=INT_MAX, len_q=1, len_k=2,
                           atten_mask=atten_mask[0, j])) for j in range(2)]
    assert kept == [True, False]


def test_explicit_masks_use_allmask_mode():
    assert npu_mask_args(MaskGeometry(4, 4, "top_left", (2, 2), has_attn_mask=True))[0] == 1


def test_top_left_causal_with_a_window_is_rejected():
    with pytest.raises(NotImplementedError, match="top-left"):
        npu_mask_args(MaskGeometry(4, 6, "top_left", (2, 0)))


def test_unmodelled_modes_and_a_missing_allmask_are_errors():
    with pytest.raises(NotImplementedError, match="sparse_mode=5"):
        npu_keeps(0, 0, sparse_mode=5, pre_tokens=0, next_tokens=0, len_q=1, len_k=1)
    with pytest.raises(ValueError, match="atten_mask"):
        npu_keeps(0, 0, sparse_mode=1, pre_tokens=0, next_tokens=0, len_q=1, len_k=1)
