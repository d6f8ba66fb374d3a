"""The feature registry: one declaration per protocol keyword, picked up (or refused) everywhere."""

import pytest
import torch

from attnformal import adapters, features, ops
from attnformal.features import Feature, registered
from attnformal.masks import MaskGeometry, may_attend
from attnformal.oracle import attention_oracle
from attnformal.spec import AttentionSpec


class LastKeyHidden(Feature):
    """A dummy index mask: with ``hide_last=True`` a row never sees its interval's last key."""

    name, role = "hide_last", "interval"

    def narrow(self, i, lo, hi, value, g):
        return lo, ops.where(value, hi - 1, hi)


class Doubled(Feature):
    """A dummy feature of a kind no implementation knows (not even the oracle)."""

    name, role = "doubled", "softmax_state"


def _inputs(seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(2, 2, 5, 8, generator=gen, dtype=torch.float64)
    k = torch.randn(2, 1, 7, 8, generator=gen, dtype=torch.float64)
    v = torch.randn(2, 1, 7, 8, generator=gen, dtype=torch.float64)
    return q, k, v


def _kernels():
    from attnformal.kernels.ring import attention as ring
    from attnformal.kernels.torch_tiled import attention as torch_tiled
    from attnformal.schedule import TileSchedule

    def split(q, k, v, **kw):
        return torch_tiled(q, k, v, schedule=TileSchedule(block_m=16, block_n=16, num_splits=2), **kw)

    out = {"torch-tiled": torch_tiled, "split-kv": split, "ring": ring}
    try:
        from attnformal.kernels.triton_flash import attention as triton_flash
    except ImportError:
        pass
    else:
        out["triton-flash"] = triton_flash
    return out


IMPLEMENTATIONS = {**{f"kernel {name}": impl for name, impl in _kernels().items()},
                   **{f"adapter {name}": impl for name, impl in adapters.ALIASES.items()}}


def test_every_keyword_is_declared_once_in_order():
    names = features.names()
    assert len(names) == len(set(names))
    assert names[:9] == ("causal", "window", "chunk_size", "kv_lens", "prefix_lens", "attn_mask", "softcap",
                         "dropout_p", "dropout_mask")
    spec = AttentionSpec.from_inputs(*_inputs())
    assert all(getattr(spec, name) == features.feature(name).default for name in names if name != "attn_mask")


def test_an_unknown_keyword_is_refused_naming_it():
    with pytest.raises(TypeError, match="'causl'"):
        AttentionSpec.from_inputs(*_inputs(), causl="top_left")
    with pytest.raises(TypeError, match="'causl'"):
        attention_oracle(*_inputs(), causl="top_left")


@pytest.mark.parametrize("name", sorted(IMPLEMENTATIONS))
def test_every_kernel_and_adapter_refuses_an_active_feature_it_does_not_declare(name):
    impl = IMPLEMENTATIONS[name]
    with registered(LastKeyHidden()):
        with pytest.raises(NotImplementedError, match="does not support hide_last"):
            impl(*_inputs(), hide_last=True)


@pytest.mark.parametrize("name", ["kernel torch-tiled", "kernel split-kv", "adapter sdpa-math"])
def test_control_an_inactive_dummy_feature_is_no_refusal(name):
    """The refusal above comes from the feature being active, not from the keyword alone."""
    with registered(LastKeyHidden()):
        out = IMPLEMENTATIONS[name](*_inputs(), hide_last=None)
    assert torch.allclose(out, attention_oracle(*_inputs()), atol=1e-10)


def test_an_interval_feature_reaches_the_predicate_the_oracle_and_the_spec_json():
    with registered(LastKeyHidden()):
        g = MaskGeometry(5, 7, hide_last=True)
        assert bool(may_attend(2, 5, g)) and not bool(may_attend(2, 6, g))
        hidden = attention_oracle(*_inputs(), hide_last=True)
        spec = AttentionSpec.from_inputs(*_inputs(), hide_last=True)
        assert spec.hide_last is True and spec.to_json()["hide_last"] is True
        assert not spec.allowed()[..., -1].any() and spec.allowed()[..., :-1].all()
    assert not torch.allclose(hidden, attention_oracle(*_inputs()))


def test_the_oracle_refuses_a_feature_of_a_kind_it_cannot_compute():
    with registered(Doubled()):
        with pytest.raises(NotImplementedError, match="the fp64 oracle does not support doubled"):
            attention_oracle(*_inputs(), doubled=2)


def test_a_feature_is_registered_only_for_the_block_and_only_once():
    with registered(Doubled()):
        assert "doubled" in features.names()
        with pytest.raises(ValueError, match="already registered"), registered(Doubled()):
            pass
    assert "doubled" not in features.names()
    with pytest.raises(TypeError, match="'doubled'"):
        AttentionSpec.from_inputs(*_inputs(), doubled=2)
