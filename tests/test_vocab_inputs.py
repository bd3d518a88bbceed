"""Bad input gets a clear error naming the argument, and leaves every request's state untouched."""

from __future__ import annotations

import pytest
import torch

from nanospec import DynamicVocab, NanoSpecConfig

FIELDS = ("col_of", "col_tok", "count", "ring", "stack", "nfree", "pos", "gathered")


@pytest.fixture
def dv() -> DynamicVocab:
    torch.manual_seed(0)
    dv = DynamicVocab(torch.randn(50, 8), 3, NanoSpecConfig(w_max=6))
    dv.start(0, torch.tensor([1, 2, 3]), torch.tensor([[4, 5], [6, 7], [8, 9]]))
    dv.start(1, torch.tensor([10, 11]))
    return dv


def _ext(dv: DynamicVocab, reqs: list[int], cands, valid=None) -> None:
    cands = cands if isinstance(cands, torch.Tensor) else torch.tensor(cands)
    valid = torch.ones(cands.shape, dtype=torch.bool) if valid is None else valid
    dv.extend(torch.tensor(reqs), cands, valid)


def _snapshot(dv: DynamicVocab) -> dict[str, torch.Tensor]:
    snap = {n: getattr(dv.state, n).clone() for n in FIELDS}
    snap["packed"] = dv.head.packed.clone()
    return snap


def _unchanged(dv: DynamicVocab, snap: dict[str, torch.Tensor]) -> bool:
    return all(torch.equal(getattr(dv.state, n), snap[n]) for n in FIELDS) and torch.equal(
        dv.head.packed, snap["packed"]
    )


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"k_pre": 0}, "k_pre"),
        ({"k_ver": -1}, "k_ver"),
        ({"w_max": 0}, "w_max"),
        ({"w_max": 2.5}, "w_max"),
        ({"w_max": True}, "w_max"),
        ({"sources": "prompt"}, "sources"),
        ({"gather": "lazy"}, "gather"),
    ],
)
def test_config_rejects_bad_settings(kwargs, match):
    with pytest.raises(ValueError, match=match):
        NanoSpecConfig(**kwargs)


def test_config_defaults_are_the_papers():
    cfg = NanoSpecConfig()
    assert (cfg.k_pre, cfg.k_ver, cfg.w_max, cfg.sources, cfg.gather) == (3, 3, 3072, "full", "async")


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda dv: _ext(dv, [0], [[1, 50]]), "candidates holds token ids outside"),
        (lambda dv: _ext(dv, [0], [[1, -2]]), "candidates holds token ids outside"),
        (lambda dv: _ext(dv, [0, 1], [[1, 2]]), "shapes disagree"),
        (lambda dv: _ext(dv, [0], [[1, 2]], torch.ones(1, 3, dtype=torch.bool)), "shapes disagree"),
        (lambda dv: _ext(dv, [0], [[1, 2]], torch.ones(1, 2)), "valid must be a bool"),
        (lambda dv: _ext(dv, [0], [[1.0, 2.0]]), "candidates must be an integer"),
        (lambda dv: _ext(dv, [3], [[1, 2]]), "reqs holds slot 3 outside"),
        (lambda dv: _ext(dv, [2], [[1, 2]]), "slot 2, which is not started"),
        (lambda dv: _ext(dv, [0, 0], [[1], [2]]), "must not repeat a slot"),
        (lambda dv: _ext(dv, [0], torch.tensor([[1, 2]], device="meta")), "candidates is on meta"),
        (lambda dv: dv.start(5, torch.tensor([1])), "req must be an int slot"),
        (lambda dv: dv.start(True, torch.tensor([1])), "req must be an int slot"),
        (lambda dv: dv.start(2, torch.tensor([], dtype=torch.long)), "at least one token"),
        (lambda dv: dv.start(2, torch.tensor([1, 99])), "prompt_ids holds token ids outside"),
        (lambda dv: dv.start(2, torch.tensor([1, 2]), torch.tensor([[1]])), "prefill_topk has 1 rows"),
        (lambda dv: dv.start(2, torch.tensor([1]), torch.tensor([[50]])), "prefill_topk holds token ids"),
        (lambda dv: dv.start(2, torch.tensor([[1]])), "prompt_ids must be 1-D"),
        (lambda dv: dv.start(2, [1, 2]), "prompt_ids must be a torch.Tensor"),
        (lambda dv: dv.logits(torch.randn(1, 8, dtype=torch.float64), torch.tensor([0])), "hidden dtype"),
        (lambda dv: dv.logits(torch.randn(2, 8), torch.tensor([0])), "hidden must be"),
        (lambda dv: dv.logits(torch.randn(1, 7), torch.tensor([0])), "hidden must be"),
        (lambda dv: dv.logits(torch.randn(1, 8), torch.tensor([2])), "not started"),
        (lambda dv: dv.token_ids(torch.tensor([0]), torch.tensor([[6]])), "cols must lie in"),
        (lambda dv: dv.token_ids(torch.tensor([0, 1]), torch.tensor([[1]])), "cols has 1 rows"),
        (lambda dv: dv.active(2), "not started"),
        (lambda dv: dv.release(-1), "req must be an int slot"),
    ],
)
def test_bad_input_raises_a_clear_error_and_changes_no_state(dv, call, match):
    snap = _snapshot(dv)
    with pytest.raises((ValueError, TypeError), match=match):
        call(dv)
    assert _unchanged(dv, snap)
    # The other requests still work after the failed call.
    dv.extend(torch.tensor([1]), torch.tensor([[12]]), torch.ones(1, 1, dtype=torch.bool))
    assert dv.active(1).tolist() == [10, 11, 12]


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ((torch.randn(10),), "lm_head_weight must be a 2-D"),
        ((torch.randint(0, 5, (10, 4)),), "floating point"),
        ((torch.randn(4, 10).T,), "contiguous"),
        ((torch.randn(10, 4), 0), "max_requests"),
    ],
)
def test_constructor_rejects_bad_weights_and_pool_sizes(args, match):
    if len(args) == 1:
        args = (*args, 2)
    with pytest.raises(ValueError, match=match):
        DynamicVocab(*args)


def test_unknown_backend_is_rejected():
    with pytest.raises(ValueError, match="backend"):
        DynamicVocab(torch.randn(10, 4), 1, backend="cuda")
