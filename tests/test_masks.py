"""The mask predicate against the spec's literal definitions, on every (i, j) of many shapes."""

from __future__ import annotations

import itertools

import pytest
import torch

from attnformal.masks import MaskGeometry, key_interval, may_attend

LENGTHS = (0, 1, 2, 5, 8, 13)
WINDOWS = (None, (0, 0), (2, 1), (3, -1), (-1, 2), (-1, -1), (0, 5))


def literal(i, j, len_q, len_k, causal, window):
    """The families exactly as the spec's docstring states them, ANDed."""
    offset = len_k - len_q
    ok = 0 <= i < len_q and 0 <= j < len_k
    if causal == "top_left":
        ok = ok and j <= i
    if causal == "bottom_right":
        ok = ok and j <= i + offset
    if window is not None:
        left, right = window
        ok = ok and (left < 0 or j >= i + offset - left) and (right < 0 or j <= i + offset + right)
    return ok


CASES = list(itertools.product(LENGTHS, LENGTHS, (None, "top_left", "bottom_right"), WINDOWS))


@pytest.mark.parametrize("len_q,len_k,causal,window", CASES)
def test_predicate_is_the_literal_definition(len_q, len_k, causal, window):
    g = MaskGeometry(len_q, len_k, causal, window)
    # One row and one column beyond each end: out-of-range indices must be refused.
    for i, j in itertools.product(range(-1, len_q + 1), range(-1, len_k + 1)):
        assert may_attend(i, j, g) == literal(i, j, len_q, len_k, causal, window), (i, j)


@pytest.mark.parametrize("len_q,len_k,causal,window", CASES[::7])
def test_tensor_evaluation_equals_python_evaluation(len_q, len_k, causal, window):
    g = MaskGeometry(len_q, len_k, causal, window)
    i = torch.arange(-1, len_q + 1)[:, None]
    j = torch.arange(-1, len_k + 1)[None, :]
    dense = torch.as_tensor(may_attend(i, j, g)).expand(len_q + 2, len_k + 2)
    expected = torch.tensor([[literal(a, b, len_q, len_k, causal, window) for b in range(-1, len_k + 1)]
                             for a in range(-1, len_q + 1)], dtype=torch.bool).reshape(dense.shape)
    assert torch.equal(dense, expected)


@pytest.mark.parametrize("causal,window", [(c, w) for c in (None, "top_left", "bottom_right") for w in WINDOWS])
def test_interval_ends_never_decrease(causal, window):
    # The schedule's tile classification relies on this; the prover shows it for all lengths.
    for len_q, len_k in itertools.product(LENGTHS, LENGTHS):
        g = MaskGeometry(len_q, len_k, causal, window)
        ends = [key_interval(i, g) for i in range(len_q)]
        assert all(a[0] <= b[0] and a[1] <= b[1] for a, b in zip(ends, ends[1:]))


def test_literal_oracle_can_fail():
    # Negative control: swapping the causal alignment must change some pair when Sq != Sk.
    g = MaskGeometry(3, 5, "top_left")
    assert any(may_attend(i, j, g) != literal(i, j, 3, 5, "bottom_right", None)
               for i in range(3) for j in range(5))


def test_unknown_causal_mode_is_refused():
    with pytest.raises(ValueError, match="causal must be one of"):
        MaskGeometry(4, 4, "upper")


def test_the_provers_independent_meaning_agrees_on_small_grids_and_refuses_unknown_modes():
    """proofs/mask_meaning.py is a Z3 formula (obligation 10 proves it equals may_attend for all
    lengths); on a few concrete shapes it gives the same answers as the literal definition here."""
    import z3

    from attnformal.proofs import mask_meaning

    for len_q, len_k, causal, window in CASES[::41]:
        for i, j in itertools.product(range(-1, len_q + 1), range(-1, len_k + 1)):
            meaning = mask_meaning.allowed(i, j, len_q=len_q, len_k=len_k, kv_len=len_k, causal=causal,
                                           window=window)
            assert z3.is_true(z3.simplify(meaning)) == literal(i, j, len_q, len_k, causal, window), (i, j)
    with pytest.raises(NotImplementedError, match="no meaning is stated"):
        mask_meaning.allowed(0, 0, len_q=1, len_k=1, kv_len=1, causal="upper", window=None)


# ---- chunked local attention (chunk_size)

CHUNKS = (1, 2, 3, 5, 16)


def literal_chunk(i, j, len_q, len_k, causal, chunk):
    """Same chunk of ``chunk`` positions, the query at its bottom-right-aligned position, ANDed."""
    return literal(i, j, len_q, len_k, causal, None) and (i + len_k - len_q) // chunk == j // chunk


def assert_literal_and_monotone(causal, literal_of, **values):
    """On every length pair: ``may_attend`` is ``literal_of(i, j, len_q, len_k)`` (one row and column past
    each end), and both ends of ``key_interval`` never decrease with the row."""
    for len_q, len_k in itertools.product(LENGTHS, LENGTHS):
        g = MaskGeometry(len_q, len_k, causal, **values)
        ends = [key_interval(i, g) for i in range(len_q)]
        assert all(a[0] <= b[0] and a[1] <= b[1] for a, b in zip(ends, ends[1:]))
        for i, j in itertools.product(range(-1, len_q + 1), range(-1, len_k + 1)):
            assert may_attend(i, j, g) == literal_of(i, j, len_q, len_k), (len_q, len_k, i, j)


@pytest.mark.parametrize("chunk", CHUNKS)
@pytest.mark.parametrize("causal", (None, "top_left", "bottom_right"))
def test_chunked_predicate_is_the_literal_definition_and_one_interval(chunk, causal):
    assert_literal_and_monotone(causal, lambda i, j, sq, sk: literal_chunk(i, j, sq, sk, causal, chunk),
                                chunk_size=chunk)


def test_chunk_literal_can_fail():
    """Negative control: chunks aligned top-left (no offset) differ when Sq != Sk."""
    g = MaskGeometry(3, 8, None, chunk_size=4)
    assert any(may_attend(i, j, g) != (0 <= j < 8 and i // 4 == j // 4) for i in range(3) for j in range(8))


# ---- prefix-LM (prefix_lens)

PREFIXES = (0, 1, 3, 8, 20)


def literal_prefix(i, j, len_q, len_k, causal, prefix):
    """Keys below the prefix visible to every query, the rest follow the causal rule."""
    in_range = 0 <= i < len_q and 0 <= j < len_k
    return in_range and (j < prefix or literal(i, j, len_q, len_k, causal, None))


@pytest.mark.parametrize("prefix", PREFIXES)
@pytest.mark.parametrize("causal", ("top_left", "bottom_right"))
def test_prefix_predicate_is_the_literal_definition_and_one_interval(prefix, causal):
    assert_literal_and_monotone(causal, lambda i, j, sq, sk: literal_prefix(i, j, sq, sk, causal, prefix),
                                prefix_lens=prefix)


def test_prefix_literal_can_fail():
    """Negative control: a prefix of 3 shows keys the plain causal mask hides."""
    g = MaskGeometry(4, 4, "top_left", prefix_lens=3)
    assert any(may_attend(i, j, g) != literal(i, j, 4, 4, "top_left", None) for i in range(4) for j in range(4))
