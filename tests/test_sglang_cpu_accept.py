"""EAGLE3 on the CPU with a draft that agrees with the target: the accept path is exercised.

The agreeing tiny target always continues ``t -> t + 1 (mod V)`` and the agreeing draft proposes the
same (tests/support/tiny_models.py), so every drafted token should be accepted. Served with a token
tree (``topk 2``), which also moves accepted KV entries (copy_all_layer_kv_cache_cpu) and uses the
verify tree mask. SGLang's reported ``spec_accept_length`` must exceed 2 and the output must be exact.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.support.sglang_server import SGLangServer
from tests.support.tiny_models import agree_next_token, make_tiny_eagle3_draft, make_tiny_llama

pytest.importorskip("sglang")

V = 512
MAX_NEW = 32
PROMPTS = [[10, 20, 30], [400, 401], [7], [250, 3, 99, 100]]
STEPS = 3


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("agree")
    target = make_tiny_llama(root / "target", vocab_size=V, agree=True)
    draft = make_tiny_eagle3_draft(root / "draft", target, agree=True)
    args = [
        "--dtype", "float32",
        "--speculative-algorithm", "EAGLE3",
        "--speculative-draft-model-path", str(draft),
        "--speculative-num-steps", str(STEPS),
        "--speculative-eagle-topk", "2",
        "--speculative-num-draft-tokens", "6",
    ]  # fmt: skip
    with SGLangServer(target, args=args, log_path=root / "server.log") as srv:
        yield srv


def _expected(prompt):
    out, t = [], prompt[-1]
    for _ in range(MAX_NEW):
        t = agree_next_token(t, V)
        out.append(t)
    return out


def test_agreeing_draft_is_accepted_and_output_is_exact(server):
    params = {"temperature": 0.0, "max_new_tokens": MAX_NEW, "ignore_eos": True}

    def generate(prompt):
        return server.post("/generate", {"input_ids": prompt, "sampling_params": params})

    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        results = list(pool.map(generate, PROMPTS))
    for prompt, res in zip(PROMPTS, results, strict=True):
        assert res["output_ids"] == _expected(prompt)
        meta = res["meta_info"]
        assert meta["spec_accept_length"] > 2.0, meta
        assert meta["spec_accept_length"] <= STEPS + 1


def test_sampling_requests_are_served_with_eagle3(server):
    """temperature > 0 goes through the same CPU verify path; the agreeing target is so peaked
    (logit margin > 20) that sampling at temperature 0.5 still yields the greedy continuation."""
    res = server.generate([5, 6], max_new_tokens=16, temperature=0.5, top_p=0.9, top_k=20)
    assert res["output_ids"] == _expected([5, 6])[:16]


def test_chat_completion_through_eagle3(server):
    res = server.chat([{"role": "user", "content": "hello"}], max_tokens=MAX_NEW)
    assert res["usage"]["completion_tokens"] == MAX_NEW
    assert isinstance(res["choices"][0]["message"]["content"], str)
