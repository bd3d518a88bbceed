"""End to end on the CPU with a real SGLang 0.5.23 server: plain decoding vs EAGLE3 speculative decoding.

A tiny random float32 Llama and a random full-vocabulary EAGLE-3 draft (built by tests/support) are
served twice, plainly and with ``--speculative-algorithm EAGLE3``, with only ``--device cpu``: the
``nanospec.cpu`` start-up hook supplies the sgl_kernel ops, ``SGLANG_USE_CPU_ENGINE`` and the CPU defaults.
Greedy outputs of 4 concurrent prompts x 32 tokens must be identical through ``/generate`` and
``/v1/chat/completions``, and the plain ones must equal transformers' greedy decoding.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from tests.support.sglang_server import SGLangServer
from tests.support.tiny_models import make_tiny_eagle3_draft, make_tiny_llama

pytest.importorskip("sglang")

PROMPTS = [
    "The quick brown fox",
    "Write a short story about a robot who learns to paint.",
    "def add(a, b):",
    "Weather today: sunny in the morning, clouds",
]
MAX_NEW = 32
EAGLE_ARGS = [
    "--speculative-algorithm", "EAGLE3",
    "--speculative-num-steps", "3",
    "--speculative-eagle-topk", "1",
    "--speculative-num-draft-tokens", "4",
]  # fmt: skip


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("e2e")
    target = make_tiny_llama(root / "target", vocab_size=512, seed=1)
    draft = make_tiny_eagle3_draft(root / "draft", target, seed=2)
    return target, draft, root


def _serve(model, log, args):
    return SGLangServer(model, args=["--dtype", "float32", *args], log_path=log)


@pytest.fixture(scope="module")
def plain_results(models):
    target, _, root = models
    with _serve(target, root / "plain.log", []) as srv:
        yield _collect(srv)


@pytest.fixture(scope="module")
def eagle_results(models):
    target, draft, root = models
    args = [*EAGLE_ARGS, "--speculative-draft-model-path", str(draft)]
    with _serve(target, root / "eagle3.log", args) as srv:
        yield _collect(srv)


def _collect(srv: SGLangServer) -> dict:
    """Run the 4 prompts concurrently through both endpoints; keep ids, texts and server facts."""
    params = {"temperature": 0.0, "max_new_tokens": MAX_NEW, "ignore_eos": True}
    batch = srv.post("/generate", {"text": PROMPTS, "sampling_params": params})
    sampled = srv.post("/generate", {"text": PROMPTS, "sampling_params": {**params, "temperature": 1.0}})

    def chat(prompt):
        return srv.chat([{"role": "user", "content": prompt}], max_tokens=MAX_NEW)

    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        chats = list(pool.map(chat, PROMPTS))
    return {
        "ids": [r["output_ids"] for r in batch],
        "texts": [r["text"] for r in batch],
        "meta": [r["meta_info"] for r in batch],
        "sampled": [r["output_ids"] for r in sampled],
        "chat": [c["choices"][0]["message"]["content"] for c in chats],
        "chat_tokens": [c["usage"]["completion_tokens"] for c in chats],
        "info": srv.server_info(),
    }


def test_plain_cpu_server_matches_transformers_greedy(models, plain_results):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target = models[0]
    tok = AutoTokenizer.from_pretrained(target)
    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
    for prompt, got in zip(PROMPTS, plain_results["ids"], strict=True):
        ids = tok(prompt, return_tensors="pt").input_ids
        want = []
        with torch.no_grad():
            for _ in range(MAX_NEW):  # plain argmax loop: no EOS handling to differ from ignore_eos
                nxt = model(ids).logits[0, -1].argmax()
                want.append(int(nxt))
                ids = torch.cat([ids, nxt.view(1, 1)], 1)
        assert got == want


def test_eagle3_generate_is_identical_to_plain(plain_results, eagle_results):
    assert all(len(ids) == MAX_NEW for ids in plain_results["ids"])
    assert eagle_results["ids"] == plain_results["ids"]
    assert eagle_results["texts"] == plain_results["texts"]


def test_eagle3_chat_completions_are_identical_to_plain(plain_results, eagle_results):
    assert plain_results["chat_tokens"] == [MAX_NEW] * len(PROMPTS)
    assert eagle_results["chat"] == plain_results["chat"]


def test_eagle3_server_really_speculates_on_the_fallback_ops(eagle_results):
    info = eagle_results["info"]
    assert info["speculative_algorithm"] == "EAGLE3"
    # Chosen by the patch layer (no AMX on CI CPUs would otherwise mean torch_native, which has no EAGLE).
    assert info["attention_backend"] == "intel_amx"
    for meta in eagle_results["meta"]:
        assert meta["spec_verify_ct"] > 0
        assert meta["spec_accept_length"] >= 1.0


def test_eagle3_samples_at_temperature_one_instead_of_taking_the_argmax(eagle_results):
    """SGLang 0.5.23 verifies greedily on CPU at any temperature; nanospec/cpu/ makes it sample. With a
    random model (logit std ~3 over 512 tokens) 4 x 32 sampled tokens equal to greedy are impossible."""
    assert [len(ids) for ids in eagle_results["sampled"]] == [MAX_NEW] * len(PROMPTS)
    assert eagle_results["sampled"] != eagle_results["ids"]


def test_cpu_defaults_come_from_the_patch_layer(plain_results):
    info = plain_results["info"]
    assert info["device"] == "cpu"
    assert info["max_total_tokens"] == 32768  # nanospec.cpu.sglang_fixes.CPU_DEFAULT_MAX_TOTAL_TOKENS
