"""The packed-head logits kernel takes draft rows grouped per request (each request's active rows read
once for all of its rows): the PyTorch twin gives today's per-row results, the Triton kernel (under
the interpreter, switched on in conftest.py) gives the twin's, and the policy prices what it reads."""

from __future__ import annotations

import pytest
import torch

from nanospec import DynamicVocab, NanoSpecConfig, policy
from nanospec.kernels import ROWS_PER_PROGRAM, torch_ops, triton_ops
from nanospec.proposer import Proposer

INF = float("-inf")


def _vocab(dtype: torch.dtype, indexed: bool, integer: bool, w_max: int = 70) -> DynamicVocab:
    """Four started slots of uneven fill (slot 3 nearly empty: whole free column tiles)."""
    g = torch.Generator().manual_seed(3)
    w = torch.randint(-3, 4, (300, 40), generator=g) if integer else torch.randn(300, 40, generator=g)
    cfg = NanoSpecConfig(w_max=w_max, gather="indexed" if indexed else "async")
    dv = DynamicVocab(w.to(dtype), 4, cfg, backend="torch")
    for r, n in enumerate((200, 55, 30, 2)):
        dv.start(r, torch.randint(0, 300, (n,), generator=g))
    return dv


def _hidden(n: int, dtype: torch.dtype, integer: bool) -> torch.Tensor:
    g = torch.Generator().manual_seed(n)
    h = torch.randint(-3, 4, (n, 40), generator=g) if integer else torch.randn(n, 40, generator=g)
    return h.to(dtype)


def _old_per_row(hidden, rows, col_tok, reqs, indexed):
    """The device twin as it was: each row multiplies its own copy of its request's rows."""
    n, w = hidden.shape[0], col_tok.shape[1]
    if indexed:
        toks = col_tok.index_select(0, reqs).clamp_min(0).long()
        wt = rows.index_select(0, toks.reshape(-1)).view(n, w, -1)
    else:
        wt = rows.index_select(0, reqs)
    out = torch.bmm(wt, hidden[:, :, None]).squeeze(-1).float()
    return out.masked_fill_(col_tok.index_select(0, reqs) < 0, INF)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("indexed", [False, True], ids=["packed", "indexed"])
@pytest.mark.parametrize("per_req", [1, 3, 8, ROWS_PER_PROGRAM + 3])
def test_twin_on_request_blocks_equals_todays_per_row_logits(indexed: bool, per_req: int,
                                                              dtype: torch.dtype):
    reqs = torch.tensor([2, 0, 3])
    per_row = reqs.repeat_interleave(per_req)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    for integer in (True, False):
        dv = _vocab(dtype, indexed, integer)
        rows = dv.weight if indexed else dv.head.packed
        hidden = _hidden(len(per_row), dtype, integer)
        old = _old_per_row(hidden, rows, dv.state.col_tok, per_row, indexed)
        cpu = torch_ops.logits(hidden, rows, dv.state.col_tok, reqs, indexed)
        dev = torch_ops.logits_batched(hidden, rows, dv.state.col_tok, reqs, indexed)
        dev = dev.masked_fill_(torch.isneginf(old), INF)
        if integer:  # exact in any summation order: the same numbers, not just close ones
            assert torch.equal(cpu, old) and torch.equal(dev, old)
        torch.testing.assert_close(cpu, old, rtol=tol, atol=tol)
        torch.testing.assert_close(dev, old, rtol=tol, atol=tol)
        # The CPU path on the per-row map is today's code, unchanged: bit for bit the same.
        assert torch.equal(cpu, torch_ops.logits(hidden, rows, dv.state.col_tok, per_row, indexed))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("indexed", [False, True], ids=["packed", "indexed"])
def test_triton_kernel_equals_its_twin_under_the_interpreter(dtype: torch.dtype, indexed: bool):
    reqs = torch.tensor([3, 1, 0])
    for per_req in (1, 8, ROWS_PER_PROGRAM + 1):
        for integer in (True, False):
            dv = _vocab(dtype, indexed, integer)
            rows = dv.weight if indexed else dv.head.packed
            hidden = _hidden(3 * per_req, dtype, integer)
            got = triton_ops.logits(hidden, rows, dv.state.col_tok, reqs, indexed)
            twin = torch_ops.logits(hidden, rows, dv.state.col_tok, reqs, indexed)
            assert torch.equal(torch.isneginf(got), torch.isneginf(twin))
            if integer:
                assert torch.equal(got, twin), (per_req, dtype)
            elif dtype == torch.float32:
                torch.testing.assert_close(got, twin, rtol=1e-5, atol=1e-5)
            else:  # the twin rounds bf16 products' sums to bf16, the kernel keeps float32
                torch.testing.assert_close(got, twin, rtol=1e-2, atol=2e-2)


def test_triton_kernel_keeps_the_any_row_map():
    dv = _vocab(torch.float32, False, True)
    reqs = torch.tensor([2, 0, 2, 3, 1])  # rows not grouped: one block per row
    hidden = _hidden(5, torch.float32, True)
    got = triton_ops.logits(hidden, dv.head.packed, dv.state.col_tok, reqs, False)
    assert torch.equal(got, _old_per_row(hidden, dv.head.packed, dv.state.col_tok, reqs, False))


def test_proposer_hands_the_kernel_one_entry_per_request_not_per_row(monkeypatch):
    dv = _vocab(torch.float32, False, False)
    prop = Proposer(dv.weight, 4, NanoSpecConfig(w_max=70), head="packed", backend="torch")
    for r in range(4):
        prop.start(r, dv.state.col_tok[r][dv.state.col_tok[r] >= 0].long(), None)
    seen: list[tuple[int, ...]] = []
    real = prop.dv.head.ops.logits

    def spy(hidden, rows, col_tok, reqs, indexed):
        seen.append(tuple(reqs.shape))
        return real(hidden, rows, col_tok, reqs, indexed)

    monkeypatch.setattr(prop.dv.head.ops, "logits", spy)
    reqs = torch.tensor([1, 3])
    hidden = _hidden(16, torch.float32, False)
    out = prop.logits(hidden, reqs)
    assert seen == [(2,)]
    per_row = prop.dv.logits(hidden, reqs.repeat_interleave(8))
    assert torch.equal(out.logits, per_row)
    assert torch.equal(out.rows, reqs.repeat_interleave(8))


def test_vocab_logits_checks_rows_per_request():
    dv = _vocab(torch.float32, False, False)
    hidden = _hidden(6, torch.float32, False)
    with pytest.raises(ValueError, match="N = len\\(reqs\\) \\* rows_per_req"):
        dv.logits(hidden, torch.tensor([0, 1]), rows_per_req=2)
    with pytest.raises(ValueError, match="rows_per_req must be a positive integer"):
        dv.logits(hidden, torch.tensor([0, 1]), rows_per_req=0)
    blocks = dv.logits(hidden, torch.tensor([0, 1]), rows_per_req=3)
    assert torch.equal(blocks, dv.logits(hidden, torch.tensor([0, 0, 0, 1, 1, 1])))


LLAMA = {"vocab": 128256, "w_max": 3072, "dim": 4096, "elem": 2}


def _packed(batch: int, rows: int) -> int:
    return policy.head_bytes(batch=batch, rows=rows, union_size=batch * 3072, **LLAMA)["packed"]


def test_policy_prices_a_requests_rows_read_once_for_all_its_draft_rows():
    weights = 3072 * 4096 * 2
    logits = 3072 * 4
    assert _packed(1, 1) == weights + logits
    assert _packed(1, 8) == weights + 8 * logits  # 8 draft rows: only the logits grow
    assert _packed(4, 32) == 4 * weights + 32 * logits
    # More rows than one program takes: the tiles are read once per block of rows.
    assert _packed(1, ROWS_PER_PROGRAM) == weights + ROWS_PER_PROGRAM * logits
    assert _packed(1, ROWS_PER_PROGRAM + 1) == 2 * weights + (ROWS_PER_PROGRAM + 1) * logits


def test_policy_keeps_the_packed_head_for_many_draft_rows_per_request():
    # 16 requests x 8 draft rows read 16 requests' rows, far below the full head.
    assert policy.choose_head(batch=16, rows=128, union_size=16 * 3072, **LLAMA) == "packed"
    assert policy.choose_head(batch=60, rows=60 * 8, union_size=60 * 3072, **LLAMA) == "full"


def _kernel_here() -> bool:
    from nanospec.cpu import gemv

    return gemv.available()


@pytest.mark.skipif(not _kernel_here(), reason="no AVX2/FMA CPU or C compiler here")
def test_cpu_head_reads_a_requests_rows_once_for_all_its_draft_rows(monkeypatch):
    # PyTorch's few-row float32 product re-reads the rows per block of draft rows; the CPU path hands
    # each request's 8 draft rows and its active rows to NanoSpec's kernel in one call.
    from nanospec.cpu import gemv

    calls = []
    real = gemv.linear

    def spy(x, w, b):
        calls.append((x.shape[0], w.shape[0]))
        return real(x, w, b)

    monkeypatch.setattr(gemv, "linear", spy)
    dv = _vocab(torch.float32, indexed=False, integer=False)
    reqs = torch.tensor([0, 2])
    hidden = _hidden(16, torch.float32, integer=False)
    got = torch_ops.logits(hidden, dv.head.packed, dv.state.col_tok, reqs, False)
    ends = [int((dv.state.col_tok[r] >= 0).nonzero()[-1]) + 1 for r in (0, 2)]
    assert calls == [(8, ends[0]), (8, ends[1])]  # one call per request, up to its last live column
    want = _old_per_row(hidden, dv.head.packed, dv.state.col_tok, reqs.repeat_interleave(8), False)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
