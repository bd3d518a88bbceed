"""NanoSpec's device memory inside SGLang's KV budget (``nanospec/sglang/memory.py``).

The plan (computed before the KV cache is sized) against the tensors a ``Runtime`` really holds; the
bounded prefill top-k temporaries; the budget hook; and two real CPU servers, EAGLE3 and NANOSPEC on
the same tiny pair with SGLang's defaults, whose KV pools differ by what NanoSpec reserves.

The servers see a pinned free-memory figure (``tests/support/pinned_memory/sitecustomize.py``): SGLang
sizes a CPU KV cache from free host memory, which other processes on a shared host move by more than
NanoSpec's buffers. Runtime: two server starts, 3.5 minutes measured on the shared 2-core host.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from nanospec.config import NanoSpecConfig
from nanospec.sglang import memory
from nanospec.sglang.runtime import Runtime, prefill_topk
from nanospec.sglang.settings import Settings
from tests.plugin_support import server, spec_args
from tests.support.tiny_models import make_tiny_eagle3_draft, make_tiny_llama

PINNED = Path(__file__).resolve().parent / "support" / "pinned_memory"


def _runtime(vocab, dim, w_max, slots, *, gather="async", hot=None, target_vocab=None, dtype=torch.float32):
    weight = torch.randn(vocab, dim).to(dtype)
    settings = Settings(vocab=NanoSpecConfig(w_max=w_max, gather=gather))
    tv = target_vocab or vocab
    rt = Runtime(weight, slots, settings, hot=hot, target_vocab=tv)
    rt.warm_up(4, 4)  # every kernel once: nothing it leaves behind may escape the count
    plan = memory.plan(slots=slots, head=weight, settings=settings, target_vocab=tv, reduced=hot is not None,
                       draft_tokens=4)
    return rt, plan, weight


@pytest.mark.parametrize("vocab, dim, w_max, slots, gather, reduced, dtype", [
    (512, 64, 3072, 49, "async", False, torch.float32),  # the CPU servers' tiny pair, default W_max
    (2000, 32, 64, 9, "async", False, torch.bfloat16),
    (300, 16, 128, 5, "async", True, torch.float32),  # reduced draft vocabulary: a target -> draft map
    (1000, 32, 256, 17, "indexed", False, torch.float16),  # no packed copy
], ids=["tiny_default", "bf16_small_window", "reduced_vocab", "indexed_gather"])
def test_memory_plan_equals_the_bytes_a_runtime_allocates(vocab, dim, w_max, slots, gather, reduced, dtype):
    hot = torch.arange(vocab) * 2 if reduced else None
    rt, plan, weight = _runtime(vocab, dim, w_max, slots, gather=gather, hot=hot,
                                target_vocab=2 * vocab if reduced else None, dtype=dtype)
    allocated = memory.allocated_bytes(rt, exclude=(weight, hot))
    assert allocated == pytest.approx(plan.persistent_bytes, rel=0.05)
    # The packed head dominates; it is counted in the weight's dtype, one spare row included.
    if gather == "async":
        assert plan.persistent()["packed_head"] == (slots * w_max + 1) * dim * weight.element_size()
    assert plan.total == plan.persistent_bytes + plan.workspace_bytes > allocated


def test_memory_plan_at_llama_8b_dims_is_the_issue_figure():
    # 49 slots (48 running requests + SGLang's padding row), W_max 3072, d 4096, bf16: about 1.2 GB.
    head = torch.empty(1, 4096, dtype=torch.bfloat16).expand(128256, 4096)  # shape and dtype only
    plan = memory.plan(slots=49, head=head, settings=Settings(), target_vocab=128256, reduced=False,
                       draft_tokens=4)
    assert plan.persistent()["packed_head"] == (49 * 3072 + 1) * 4096 * 2
    assert 1.2e9 < plan.persistent_bytes < 1.3e9
    assert plan.workspace()["prefill_topk_logits"] <= memory.PREFILL_TOPK_BYTES


def test_prefill_topk_never_materialises_more_logits_than_reserved():
    vocab, k = 200_000, 3
    rows_seen = []

    def lm_head(h):  # a [t, V] float32 logits view without the memory (stride 0 along rows)
        rows_seen.append(h.shape[0])
        return torch.arange(vocab, dtype=torch.float32)[None, :].expand(h.shape[0], vocab)

    out = prefill_topk(torch.zeros(2048, 8), lm_head, vocab, k)
    assert out.shape == (2048, k) and sum(rows_seen) == 2048
    assert max(rows_seen) * vocab * 4 <= memory.PREFILL_TOPK_BYTES
    plan = memory.plan(slots=2, head=torch.empty(vocab, 8), settings=Settings(), target_vocab=vocab,
                       reduced=False, draft_tokens=4)
    assert max(rows_seen) * vocab * 4 <= plan.workspace()["prefill_topk_logits"]
    assert out[0].tolist() == [vocab - 1, vocab - 2, vocab - 3]


def _draft_extend(rt: Runtime, hidden: torch.Tensor, reqs: torch.Tensor) -> torch.Tensor:
    """What SGLang's draft logits processor returns for a draft-extend pass through NanoSpec's head."""
    from nanospec.sglang.hooks import IdMap, install_draft_head

    proc = SimpleNamespace(_get_logits=None)
    proc.forward = lambda input_ids, h, lm_head, meta, *a, **k: proc._get_logits(h, lm_head, meta)
    install_draft_head(proc, rt, IdMap(rt.proposer.out_vocab))
    fb = SimpleNamespace(req_pool_indices=reqs, forward_mode=SimpleNamespace(is_decode=lambda: False))
    return proc.forward(None, hidden, None, fb)


@pytest.mark.parametrize("head", ["auto", "union", "full"])
def test_draft_extend_logits_span_the_window_and_map_to_each_requests_best_token(head):
    from nanospec.sglang.hooks import extend_token_ids

    torch.manual_seed(0)
    vocab, dim, w_max, tokens = 4096, 16, 32, 4
    weight = torch.randn(vocab, dim)
    rt = Runtime(weight, 4, Settings(vocab=NanoSpecConfig(w_max=w_max), head=head), target_vocab=vocab)
    prompts = {1: [3, 9, 12, 700], 2: [7, 50, 4000]}
    for slot, ids in prompts.items():
        rt.proposer.start(slot, torch.tensor(ids), None)
    reqs, hidden = torch.tensor([2, 1]), torch.randn(2 * tokens, dim)
    logits = _draft_extend(rt, hidden, reqs)
    # SGLang keeps the last accepted row of each request and takes its top-k (here the argmax).
    select = torch.tensor([tokens - 1, 2 * tokens - 2])
    cols = logits[select].argmax(-1, keepdim=True)
    got = extend_token_ids(rt.proposer, reqs, cols)[:, 0].tolist()
    full = hidden[select] @ weight.T
    if head == "full":  # forced full head: the whole vocabulary, as EAGLE3
        assert logits.shape == (2 * tokens, vocab) and got == full.argmax(-1).tolist()
        return
    assert logits.shape == (2 * tokens, w_max)  # never [N, V]
    assert got == [max(prompts[s], key=lambda t: full[r, t].item()) for r, s in enumerate((2, 1))]


def test_draft_extend_of_a_reduced_draft_vocabulary_returns_target_ids():
    from nanospec.sglang.hooks import extend_token_ids

    torch.manual_seed(1)
    hot = torch.arange(64) * 2  # draft row r is target token 2r
    weight = torch.randn(64, 8)
    rt = Runtime(weight, 3, Settings(vocab=NanoSpecConfig(w_max=16)), hot=hot, target_vocab=128)
    rt.proposer.start(1, torch.tensor([4, 10, 30, 31]), None)  # 31 has no draft row
    reqs, hidden = torch.tensor([1]), torch.randn(1, 8)
    logits = _draft_extend(rt, hidden, reqs)
    assert logits.shape == (1, 16)
    got = int(extend_token_ids(rt.proposer, reqs, logits.argmax(-1, keepdim=True)))
    assert got == max([4, 10, 30], key=lambda t: (hidden @ weight.T)[0, t // 2].item())


def test_kv_budget_hook_takes_the_plan_from_the_target_only(monkeypatch):
    monkeypatch.setattr(memory, "_announced", [])
    target, draft = SimpleNamespace(is_draft_worker=False), SimpleNamespace(is_draft_worker=True)
    assert memory.take_from_kv_budget(10**9, target, 5.0) == 10**9  # no NANOSPEC worker: SGLang's sizing
    plan = memory.plan(slots=9, head=torch.empty(512, 64), settings=Settings(), target_vocab=512,
                       reduced=False, draft_tokens=4)
    memory.announce(plan)
    assert memory.take_from_kv_budget(10**9, target, 5.0) == 10**9 - plan.total
    assert memory.take_from_kv_budget(10**9, draft, 5.0) == 10**9
    with pytest.raises(ValueError, match="NANOSPEC needs .* more than the .* left for the KV cache"):
        memory.take_from_kv_budget(plan.total // 2, target, 5.0)


# -- two real servers ---------------------------------------------------------------------------

TOKENS_RE = re.compile(r"max_total_num_tokens=(\d+)")
RESERVED_RE = re.compile(r"NANOSPEC reserves (\d+) bytes of the KV cache budget \((\d+) -> (\d+) bytes\)")
ALLOCATED_RE = re.compile(r"NANOSPEC memory: allocated (\d+) bytes of persistent state; reserved (\d+) "
                          r"bytes before the KV cache \(persistent (\d+)\)")


@pytest.fixture(scope="module")
def logs(tmp_path_factory):
    root = tmp_path_factory.mktemp("memory_models")
    target = make_tiny_llama(root / "target", vocab_size=512)
    draft = make_tiny_eagle3_draft(root / "draft", target)
    log_dir = tmp_path_factory.mktemp("memory_logs")
    env = {
        "PYTHONPATH": os.pathsep.join(p for p in (str(PINNED), os.environ.get("PYTHONPATH")) if p),
        "NANOSPEC_TEST_AVAILABLE_BYTES": str(256 << 20),
        "NANOSPEC_CPU_MAX_TOTAL_TOKENS": str(10**8),  # let the budget, not NanoSpec's CPU cap, size it
    }
    out = {}
    for algo in ("EAGLE3", "NANOSPEC"):  # one after the other: each pool takes ~200 MB
        with server(target, spec_args(algo, draft), log_dir, algo.lower(), env=env) as srv:
            out[algo] = srv.log_text()
    return out


def test_kv_pool_shrinks_by_what_nanospec_reserves_against_eagle3(logs):
    eagle_tokens = int(TOKENS_RE.findall(logs["EAGLE3"])[-1])
    nano_tokens = int(TOKENS_RE.findall(logs["NANOSPEC"])[-1])
    found = RESERVED_RE.findall(logs["NANOSPEC"])
    assert found, "the NANOSPEC server did not take its memory out of the KV budget"
    reserved, before, after = (int(x) for x in found[-1])
    assert before - after == reserved and "NANOSPEC reserves" not in logs["EAGLE3"]
    allocated, logged, persistent = (int(x) for x in ALLOCATED_RE.findall(logs["NANOSPEC"])[-1])
    assert logged == reserved and allocated == pytest.approx(persistent, rel=0.05)
    assert reserved - persistent < persistent / 4  # the rest: the bounded temporaries
    cell = before / eagle_tokens  # bytes per token of KV (target + draft layers), same for both servers
    # Same total as EAGLE3: NanoSpec's KV pool plus its reservation equals EAGLE3's pool, within a token.
    assert abs((eagle_tokens - nano_tokens) * cell - reserved) <= 2 * cell
