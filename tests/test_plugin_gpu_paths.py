"""SGLang's GPU-only entry paths, reproduced on the CPU: the padded prefill graph, draft and
draft-extend steps entered the way a CUDA-graph replay enters them, and the head chosen for a
graph captured before the union estimate moved.

On a CPU SGLang captures no graph, so these tests build the same situations by hand: the
prefill hook gets hidden states padded to a bucket as the prefill graph hands them over; a "replay"
reads the packed buffer directly (a captured kernel runs no Python of ours); the side stream is a
queue that lands its gathers only when someone waits for them.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode
from sglang.srt.speculative.eagle_worker_v2 import EagleDraftWorker

from nanospec import NanoSpecConfig
from nanospec import proposer as proposer_mod
from nanospec.sglang import hooks
from nanospec.sglang.runtime import Runtime
from nanospec.sglang.settings import Settings
from nanospec.sglang.worker import NanoSpecDraftWorker

VOCAB, DIM = 64, 8


def _req(rid, ids, slot):
    return SimpleNamespace(rid=rid, full_untruncated_fill_ids=ids, kv=SimpleNamespace(req_pool_idx=slot))


def _runtime(**cfg) -> Runtime:
    torch.manual_seed(3)
    return Runtime(torch.randn(VOCAB, DIM), 4, Settings(vocab=NanoSpecConfig(**cfg)), target_vocab=VOCAB)


class DeferredGathers:
    """Stands in for the CUDA side stream: a queued gather lands only when someone waits."""

    def __init__(self, packed_head):
        self.pending: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.copy = packed_head.gather  # the CPU gather copies at once
        packed_head.gather = lambda dst, src: self.pending.append((dst.clone(), src.clone()))
        packed_head.wait = self.flush

    def flush(self) -> None:
        for dst, src in self.pending:
            self.copy(dst, src)
        self.pending.clear()


def replayed_logits(rt: Runtime, hidden: torch.Tensor, reqs: torch.Tensor) -> torch.Tensor:
    """What a replayed graph computes: the packed-head kernel on the buffer as it is, no wait."""
    ph = rt.proposer.dv.head
    return ph.ops.logits(hidden, ph.packed, rt.proposer.dv.column_tokens(), reqs, False)


def exact_logits(rt: Runtime, hidden: torch.Tensor, reqs: torch.Tensor) -> torch.Tensor:
    tok = rt.proposer.dv.column_tokens()[reqs].long()
    out = torch.einsum("nd,nwd->nw", hidden, rt.proposer.weight[tok.clamp_min(0)])
    return out.masked_fill(tok < 0, float("-inf"))


def _worker(rt: Runtime) -> NanoSpecDraftWorker:
    w = object.__new__(NanoSpecDraftWorker)
    w.nano, w.topk, w.speculative_num_draft_tokens = rt, 1, 4
    w.cuda_graph_runner, w.cuda_graph_runner_for_draft_extend = object(), object()
    return w


def _decoding_request(rt: Runtime) -> None:
    """Slot 1 after a prefill and one verify; the verify's new rows still queued."""
    rt.stash_prefill_topk(torch.tensor([[20], [21]]))
    rt.start_batch(SimpleNamespace(reqs=[_req("a", [1, 2], 1)], prefix_lens=[0], extend_lens=[2]))
    logits = torch.zeros(2, VOCAB)
    logits[0, 33], logits[1, 34] = 1.0, 1.0
    rt.after_verify(reqs=torch.tensor([1]), draft_tokens=torch.tensor([2, 21]),
                    accept_index=torch.tensor([[0, 1]]), accept_lens=torch.tensor([2]),
                    predict=torch.tensor([21, 34]), logits=logits)


# -- 1. prefill CUDA graph ---------------------------------------------------------------------------

class TargetLogitsProcessor:
    vocab_size = VOCAB

    def __init__(self, weight):
        self.weight = weight

    def forward(self, input_ids, hidden_states, lm_head, logits_metadata, *args, **kwargs):
        return "next-token logits"

    def _compute_lm_head(self, hidden, lm_head):
        return hidden @ self.weight.T


def _padded_prefill_batch(lens: list[int]) -> ForwardBatch:
    # The fields SGLang's prefill graph runner copies from the live batch into its padded one.
    fb = object.__new__(ForwardBatch)
    fb.forward_mode = ForwardMode.EXTEND
    fb.extend_num_tokens = sum(lens)
    fb.extend_seq_lens_cpu = list(lens)
    return fb


def _count_head_rows(proc: TargetLogitsProcessor) -> list[int]:
    """The row count of every call to proc's LM head from now on (the list fills as it runs)."""
    rows_seen: list[int] = []
    head = proc._compute_lm_head
    proc._compute_lm_head = lambda h, lm_head: rows_seen.append(h.shape[0]) or head(h, lm_head)
    return rows_seen


def test_prefill_hook_ignores_the_padding_rows_of_a_prefill_graph():
    rt = _runtime(w_max=32, k_pre=2)
    proc = TargetLogitsProcessor(torch.randn(VOCAB, DIM))
    hooks.install_prefill_topk(proc, rt)
    lens, bucket = [3, 2], 8  # 5 prompt tokens padded to the captured bucket of 8
    hidden = torch.randn(bucket, DIM)
    assert proc.forward(torch.zeros(bucket, dtype=torch.long), hidden, None,
                        _padded_prefill_batch(lens)) == "next-token logits"
    reqs = [_req("a", [1, 2, 3], 1), _req("b", [4, 5], 2)]
    rt.start_batch(SimpleNamespace(reqs=reqs, prefix_lens=[0, 0], extend_lens=lens))
    top = (hidden[:5] @ proc.weight.T).topk(2, dim=-1).indices
    for req, rows in zip(reqs, (top[:3], top[3:]), strict=True):
        stream = list(req.full_untruncated_fill_ids) + rows.reshape(-1).tolist()
        assert rt.proposer.dv.active(req.kv.req_pool_idx).tolist() == sorted(set(stream))


def test_prefill_hook_runs_the_target_head_only_at_each_prompts_last_positions():
    rt = _runtime(w_max=32, k_pre=2, pre_positions=2)
    proc = TargetLogitsProcessor(torch.randn(VOCAB, DIM))
    rows_seen = _count_head_rows(proc)
    hooks.install_prefill_topk(proc, rt)
    lens = [5, 1]
    hidden = torch.randn(6, DIM)
    proc.forward(torch.zeros(6, dtype=torch.long), hidden, None, _padded_prefill_batch(lens))
    assert sum(rows_seen) == 3  # positions 3 and 4 of the first prompt, 0 of the second
    reqs = [_req("a", [1, 2, 3, 4, 5], 1), _req("b", [6], 2)]
    rt.start_batch(SimpleNamespace(reqs=reqs, prefix_lens=[0, 0], extend_lens=lens))
    top = (hidden @ proc.weight.T).topk(2, dim=-1).indices
    for req, rows in zip(reqs, (top[3:5], top[5:]), strict=True):
        stream = list(req.full_untruncated_fill_ids) + rows.reshape(-1).tolist()
        assert rt.proposer.dv.active(req.kv.req_pool_idx).tolist() == sorted(set(stream))


def test_a_cold_prefill_runs_no_target_head_and_starts_the_stream_from_the_prompt():
    rt = _runtime(w_max=32, k_pre=2)
    proc = TargetLogitsProcessor(torch.randn(VOCAB, DIM))
    rows_seen = _count_head_rows(proc)
    hooks.install_prefill_topk(proc, rt)
    rt.cold_prefill = True  # the step controller settled on plain decoding
    fb = _padded_prefill_batch([3])
    fb.extend_seq_lens_cpu = None  # lengths unknown: a warm prefill would run the head on every row
    proc.forward(torch.zeros(3, dtype=torch.long), torch.randn(3, DIM), None, fb)
    assert rows_seen == []
    rt.start_batch(SimpleNamespace(reqs=[_req("a", [7, 2, 9], 1)], prefix_lens=[0], extend_lens=[3]))
    assert rt.proposer.dv.active(1).tolist() == [2, 7, 9]
    assert rt.decode_size([_req("a", [7, 2, 9], 1), _req("b", [1], 2)]) == 2
    # Its acceptance does not teach the step controller (the draft never saw its prompt), until it ends.
    assert rt.warm_rows([_req("a", [7, 2, 9], 1), _req("b", [1], 2)]) == [False, True]
    rt.release(1)
    assert rt.warm_rows([_req("a", [7, 2, 9], 1)]) == [True]


def test_prompt_rows_without_lengths_keep_every_row():
    assert hooks.prompt_rows(SimpleNamespace(), 7) == 7
    assert hooks.prompt_rows(SimpleNamespace(extend_num_tokens=None, extend_seq_lens_cpu=[2, 3]), 9) == 5


# -- 2. side-stream gathers and graph replay -----------------------------------------------------------

def test_graph_replayed_draft_step_sees_every_queued_gather(monkeypatch):
    rt = _runtime(w_max=16, k_ver=1)
    stream = DeferredGathers(rt.proposer.dv.head)
    _decoding_request(rt)
    assert stream.pending  # the verify's rows are in flight
    reqs, hidden = torch.tensor([1]), torch.randn(1, DIM)
    seen = {}

    def replay(worker, batch, **kwargs):
        seen["logits"] = replayed_logits(worker.nano, hidden, reqs)

    monkeypatch.setattr(EagleDraftWorker, "draft", replay)
    _worker(rt).draft(SimpleNamespace(seq_lens=torch.tensor([5])))
    torch.testing.assert_close(seen["logits"], exact_logits(rt, hidden, reqs))


def test_graph_replayed_draft_extend_sees_every_queued_gather(monkeypatch):
    rt = _runtime(w_max=16, k_ver=1)
    stream = DeferredGathers(rt.proposer.dv.head)
    _decoding_request(rt)
    assert stream.pending
    reqs, hidden = torch.tensor([1, 1, 1, 1]), torch.randn(4, DIM)  # 4 draft tokens per request
    seen = {}

    def replay(worker, batch, batch_result, **kwargs):
        seen["logits"] = replayed_logits(worker.nano, hidden, reqs)

    monkeypatch.setattr(EagleDraftWorker, "_draft_extend_for_decode", replay)
    _worker(rt)._draft_extend_for_decode(SimpleNamespace(seq_lens=torch.tensor([5])), None,
                                         kv_loc_plan=None)
    torch.testing.assert_close(seen["logits"], exact_logits(rt, hidden, reqs))


# -- 3. head choice under CUDA graphs ------------------------------------------------------------------

def _big_head() -> proposer_mod.Proposer:
    # Sizes where the union wins once vocabularies overlap: V 4096, d 64, W 256, 4 requests.
    torch.manual_seed(0)
    head = proposer_mod.Proposer(torch.randn(4096, 64), 4, NanoSpecConfig(w_max=256))
    for slot in range(4):
        head.start(slot, torch.arange(slot, slot + 200), None)
    return head


def test_head_captured_in_a_graph_is_stale_once_the_union_estimate_moves(monkeypatch):
    head = _big_head()
    monkeypatch.setattr(proposer_mod, "capturing", lambda t: True)
    out = head.logits(torch.randn(4, 64), torch.arange(4))  # what graph capture at batch size 4 runs
    monkeypatch.setattr(proposer_mod, "capturing", lambda t: False)
    assert out.kind == "packed" and head.graph_is_current(4, 4)
    head.estimate.observe(210, 4, 256)  # measured: the four windows share most tokens
    assert head.choose(4, 4) == "union"
    assert not head.graph_is_current(4, 4)


ENTRIES = [("draft", "cuda_graph_runner"), ("_draft_extend_for_decode", "cuda_graph_runner_for_draft_extend")]


@pytest.mark.parametrize("entry, runner", ENTRIES)
def test_step_runs_eagerly_when_its_graph_holds_another_head(monkeypatch, entry, runner):
    rt = _runtime(w_max=16)
    rt.proposer = _big_head()
    monkeypatch.setattr(proposer_mod, "capturing", lambda t: True)
    rt.proposer.logits(torch.randn(16, 64), torch.arange(4))  # captured at 4 requests, 16 rows
    monkeypatch.setattr(proposer_mod, "capturing", lambda t: False)
    used = []
    monkeypatch.setattr(EagleDraftWorker, entry,
                        lambda worker, batch, *args, **kw: used.append(getattr(worker, runner)))
    worker = _worker(rt)
    worker.topk = 4
    call = getattr(worker, entry)
    args = (None,) if entry != "draft" else ()
    batch = SimpleNamespace(seq_lens=torch.tensor([5, 5, 5, 5]))
    call(batch, *args)
    rt.proposer.estimate.observe(210, 4, 256)
    call(batch, *args)
    assert used[0] is not None and used[1] is None  # graph, then eager with the union head
    assert getattr(worker, runner) is used[0]  # the runner is back for the next step


# -- 4. start-up ------------------------------------------------------------------------------------------

def test_warm_up_runs_every_kernel_once_and_leaves_the_state_as_new(monkeypatch):
    rt, fresh = _runtime(w_max=16, k_ver=2), _runtime(w_max=16, k_ver=2)
    ops, ran = rt.proposer.dv.ops, set()

    class Counting:
        def __getattr__(self, name):
            ran.add(name)
            return getattr(ops, name)

    monkeypatch.setattr(rt.proposer.dv, "ops", Counting())
    monkeypatch.setattr(rt.proposer.dv.head, "ops", Counting())
    rt.warm_up(tree_tokens=4, width=4)
    assert {"extend", "gather", "logits"} <= ran
    assert float(rt.stats.dev.abs().sum()) == 0.0 and rt.proposer.step == 0 and not rt.slot_rid
    for r in (rt, fresh):
        r.stash_prefill_topk(torch.tensor([[20, 22], [21, 20]]))
        r.start_batch(SimpleNamespace(reqs=[_req("a", [1, 2], 0)], prefix_lens=[0], extend_lens=[2]))
    for name in ("col_of", "col_tok", "count", "ring", "stack", "nfree", "pos", "gathered"):
        assert torch.equal(getattr(rt.proposer.dv.state, name), getattr(fresh.proposer.dv.state, name)), name
    assert rt.starts == 1
