"""NANOSPEC with an EAGLE(-2) draft (SGLang's ``LlamaForCausalLMEagle``) instead of an EAGLE-3 one.

Two CPU servers on the agreeing tiny target (float32), SGLang's own ``EAGLE`` and ``NANOSPEC``, both
with the agreeing EAGLE-2 draft of ``make_tiny_eagle_draft``, against plain greedy decoding of the target
in transformers (the agreeing target's next token wins by a wide margin: no engine differs there).
The agreeing pair makes the builder checkable through a server: SGLang skips checkpoint names it does
not know, so only an accept length at the maximum shows every weight landed where the construction
put it.
"""

from __future__ import annotations

import pytest
import torch

from nanospec.bench.coverage import greedy_trace
from nanospec.sglang.algo import draft_is_eagle3
from tests.plugin_support import PROMPTS, generate_all, output_ids, server, spec_args
from tests.support.tiny_models import make_tiny_eagle3_draft, make_tiny_eagle_draft, make_tiny_llama

V = 512
NEW = 24  # 6 verify steps of 3 drafts + the bonus token
TREE = ["--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
        "--speculative-num-draft-tokens", "4"]
# The packed head over each request's own vocabulary (the automatic choice would take the full
# head on a 512-token vocabulary, where the draft never depends on the dynamic vocabulary).
# The fixed chain: accept lengths are compared with SGLang's at the same tree (the step controller would
# run other step counts while it learns).
NANO_ENV = {"NANOSPEC_HEAD": "packed", "NANOSPEC_W_MAX": "256", "NANOSPEC_STEPS": "fixed"}
# Answer in the prompt (0), answer absent (1, 2), answer half in the prompt across the wrap (3).
ID_PROMPTS = [list(range(100, 140)) + [99], list(range(500, V)) + [499]]
MIXED = [ID_PROMPTS[0], PROMPTS[1], PROMPTS[3], ID_PROMPTS[1]]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("eagle2_models")
    target = make_tiny_llama(root / "target", vocab_size=V, agree=True)
    draft = make_tiny_eagle_draft(root / "draft", target, agree=True)
    return target, draft, tmp_path_factory.mktemp("eagle2_logs")


def _generate(srv, prompts) -> list[dict]:
    return [srv.generate(p, max_new_tokens=NEW) for p in prompts]


@pytest.fixture(scope="module")
def reference(models) -> list[list[int]]:
    """Plain greedy decoding of each of ``MIXED`` (the servers' ``ignore_eos``: no stop)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target = models[0]
    tok = AutoTokenizer.from_pretrained(str(target))
    model = AutoModelForCausalLM.from_pretrained(str(target), dtype=torch.float32)
    prompts = [p if isinstance(p, list) else tok(p)["input_ids"] for p in MIXED]
    return [greedy_trace(model, torch.tensor(ids), NEW, eos_ids=set(), k_pre=1, k_ver=1).tokens.tolist()
            for ids in prompts]


@pytest.fixture(scope="module")
def eagle(models) -> list[dict]:
    target, draft, logs = models
    with server(target, spec_args("EAGLE", draft) + TREE, logs, "eagle") as srv:
        return _generate(srv, MIXED)


@pytest.fixture(scope="module")
def nano(models) -> tuple[list[dict], list[dict], str]:
    """One request at a time, then all four in one batch; and the server log."""
    target, draft, logs = models
    with server(target, spec_args("NANOSPEC", draft) + TREE, logs, "nanospec", env=NANO_ENV) as srv:
        alone = _generate(srv, MIXED)
        together = generate_all(srv, MIXED, concurrent=True, max_new_tokens=NEW)
        return alone, together, srv.log_text()


def test_the_draft_is_told_apart_from_an_eagle3_draft(models, tmp_path):
    target, draft, _ = models
    assert not draft_is_eagle3(str(draft))
    assert draft_is_eagle3(str(make_tiny_eagle3_draft(tmp_path / "e3", target)))


def test_plain_reference_is_the_agreeing_chain(reference):
    for prompt, out in zip(ID_PROMPTS, (reference[0], reference[3]), strict=True):
        assert out == [(prompt[-1] + i) % V for i in range(1, NEW + 1)]


def test_sglang_eagle_serves_the_draft_and_accepts_every_token(eagle, reference):
    assert [output_ids(r) for r in eagle] == reference
    assert [r["meta_info"]["spec_accept_length"] for r in eagle] == [4.0] * len(MIXED)


def test_nanospec_greedy_output_equals_plain_decoding(nano, reference):
    alone, together, log = nano
    assert [output_ids(r) for r in alone] == reference
    assert [output_ids(r) for r in together] == reference
    assert "head=packed" in log and "w_max=256" in log


def test_nanospec_drafts_from_its_vocabulary_and_reports_it(nano, eagle):
    responses, together, _ = nano
    for r in responses + together:
        meta = r["meta_info"]
        assert 0 < meta["nanospec_mean_active_vocab"] <= 256
        assert meta["nanospec_draft_steps"] == meta["spec_verify_ct"]
    # The answer is in the prompt: the packed head proposes it as EAGLE's full head does.
    assert responses[0]["meta_info"]["spec_accept_length"] == eagle[0]["meta_info"]["spec_accept_length"]
    assert responses[0]["meta_info"]["nanospec_hit_rate"] == 1.0
