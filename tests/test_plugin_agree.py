"""Accept length of NANOSPEC with a draft that always agrees with the target.

The agreeing target emits t+1, t+2, ... after a prompt ending in t and its draft proposes exactly
that, so a full-vocabulary head accepts every draft token: the chain's maximum, 3 drafts + the bonus
token (SGLang's own EAGLE3 reaches it with such pairs in test_sglang_cpu_accept.py and
test_plugin_drafts.py). NANOSPEC can only propose tokens of its active vocabulary: the maximum shows
the dynamic vocabulary holds the answer; a lower one with context-only candidates shows the top-k
extension candidates really enter it.
"""

from __future__ import annotations

import pytest
import torch

from tests.plugin_support import server, spec_args
from tests.support.tiny_models import make_tiny_eagle3_draft, make_tiny_llama

TREE = ["--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
        "--speculative-num-draft-tokens", "4"]
W_MAX = "256"  # below the 512-token vocabulary, so the per-batch policy picks the packed head
NEW = 16  # the prefill's token + 4 verify cycles of 4, 4, 4 and 3 tokens
MAX_ACCEPT = 4.0  # every cycle's 3 drafts + the bonus token (16 tokens / 4 verify cycles)


@pytest.fixture(scope="module")
def agree(tmp_path_factory):
    root = tmp_path_factory.mktemp("agree_models")
    target = make_tiny_llama(root / "target", vocab_size=512, agree=True)
    draft = make_tiny_eagle3_draft(root / "draft", target, agree=True)
    return target, draft, tmp_path_factory.mktemp("agree_logs")


def _top3_table(target) -> torch.Tensor:
    """Target top-3 next tokens of every token id [512, 3] (the agreeing target's next-token
    distribution depends on the current token only)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32)
    with torch.no_grad():
        logits = model(torch.arange(512)[None]).logits[0]
    return logits.topk(3, dim=-1).indices


def _extension_only_prompt(top3: torch.Tensor, start: int) -> list[int]:
    """A prompt ending in ``start`` whose answer (start+1, start+2, ...) is absent from the prompt
    but present among the 2nd/3rd target candidates at its positions (the prefill top-K_pre)."""
    answer = set(range(start + 1, start + NEW + 2))
    prompt: list[int] = []
    for a in range(start + 2, start + NEW + 2):
        t = next((t for t in range(512) if a in top3[t, 1:].tolist() and t not in answer
                  and t != start and int(top3[t, 0]) not in answer), None)
        if t is None:
            pytest.skip(f"no prompt token proposes {a} as a 2nd/3rd candidate")
        prompt.append(t)
    return prompt + [start]


def _run(srv, prompts):
    out = []
    for p in prompts:
        r = srv.generate(p, max_new_tokens=NEW)
        assert r["output_ids"] == [(p[-1] + i) % 512 for i in range(1, NEW + 1)]
        out.append(r["meta_info"]["spec_accept_length"])
    return out


@pytest.fixture(scope="module")
def accept_lengths(agree):
    target, draft, logs = agree
    top3 = _top3_table(target)
    prompts = [list(range(100, 140)) + [99], list(range(400, 380, -1)) + [379],
               _extension_only_prompt(top3, 300)]
    runs = {}
    # The fixed chain of TREE, whose maximum is MAX_ACCEPT (the step controller would run other step
    # counts while it learns).
    fixed = {"NANOSPEC_W_MAX": W_MAX, "NANOSPEC_STEPS": "fixed"}
    context = {**fixed, "NANOSPEC_SOURCES": "context"}
    for name, env in [("full", fixed), ("context", context)]:
        with server(target, spec_args("NANOSPEC", draft) + TREE, logs, f"agree_{name}", env=env) as srv:
            runs[name] = _run(srv, prompts)
            assert "head=auto" in srv.log_text()
    return runs


def test_every_draft_token_is_accepted_with_an_agreeing_draft(accept_lengths):
    assert accept_lengths["full"] == [MAX_ACCEPT] * 3


def test_context_only_candidates_accept_less_when_the_answer_is_not_in_the_prompt(accept_lengths):
    # Prompts 0 and 1 contain their answers: context-only is as good there.
    assert accept_lengths["context"][:2] == [MAX_ACCEPT] * 2
    assert accept_lengths["context"][2] < accept_lengths["full"][2]
