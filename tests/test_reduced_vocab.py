"""NanoSpec over a reduced draft vocabulary (an EAGLE-3 ``d2t`` head, SGLang's ``--speculative-token-map``).

The draft head has rows for only some target ids (``hot``: draft row -> target id). The design: a
request's stream lives in draft-row space, and a target token the head has no row for is not an
entry of it (it takes no window place; the draft could never propose it anyway). So the active set
is the distinct in-draft tokens among the last ``w_max`` in-draft stream entries. Checked here
against the plain-Python reference of ``tests/vocab_reference.py`` run on the filtered stream.
"""

from __future__ import annotations

import pytest
import torch

from nanospec.config import NanoSpecConfig
from nanospec.proposer import Proposer
from tests.vocab_reference import ReferenceVocab

V_TARGET, V_DRAFT, DIM = 200, 60, 16
K_PRE, K_VER, STEPS, TREE = 3, 2, 3, 4  # a chain: T = S1 = 4 tokens verified per request


def _hot(seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randperm(V_TARGET, generator=g)[:V_DRAFT].sort().values


def _in_draft(tokens, hot: torch.Tensor) -> list[int]:
    members = set(hot.tolist())
    return [t for t in tokens if t in members]


@pytest.mark.parametrize("w_max", [8, 64])
def test_reduced_vocabulary_active_set_is_the_reference_over_in_draft_tokens(w_max):
    g = torch.Generator().manual_seed(w_max)
    hot = _hot(1)
    prop = Proposer(torch.randn(V_DRAFT, DIM, generator=g), 3,
                    NanoSpecConfig(k_pre=K_PRE, k_ver=K_VER, w_max=w_max), head="packed", hot=hot,
                    target_vocab=V_TARGET)
    ref = ReferenceVocab(w_max)
    slots = [0, 2]
    for slot in slots:
        prompt = torch.randint(0, V_TARGET, (20,), generator=g)
        topk = torch.randint(0, V_TARGET, (20, K_PRE), generator=g)
        prop.start(slot, prompt, topk)
        ref.start(slot, _in_draft(prompt.tolist(), hot), [_in_draft(r, hot) for r in topk.tolist()])

    def active(slot):
        return sorted(hot[prop.dv.active(slot)].tolist())

    for slot in slots:
        assert active(slot) == ref.active(slot)
    reqs = torch.tensor(slots)
    for _ in range(6):
        draft_tokens = torch.randint(0, V_TARGET, (len(slots) * TREE,), generator=g)
        logits = torch.randn(len(slots) * TREE, V_TARGET, generator=g)
        accept_lens = torch.randint(1, STEPS + 2, (len(slots),), generator=g)
        width = torch.arange(STEPS + 1)
        accept_index = torch.where(width[None, :] < accept_lens[:, None],
                                   torch.arange(len(slots))[:, None] * TREE + width[None, :], -1)
        predict = torch.randint(0, V_TARGET, (len(slots) * TREE,), generator=g)
        prop.after_verify(reqs=reqs, draft_tokens=draft_tokens, accept_index=accept_index,
                          accept_lens=accept_lens, predict=predict, logits=logits)
        for b, slot in enumerate(slots):
            cands = draft_tokens[b * TREE:(b + 1) * TREE].tolist()
            for row in accept_index[b].tolist():
                if row >= 0:
                    cands += logits[row].topk(K_VER).indices.tolist()
            kept = _in_draft(cands, hot)
            ref.extend(slot, kept, [True] * len(kept))
            assert active(slot) == ref.active(slot)


@pytest.mark.parametrize("kind", ["packed", "union", "full"])
def test_reduced_vocabulary_proposes_the_best_in_draft_token_of_the_active_set(kind):
    hot = _hot(2)
    g = torch.Generator().manual_seed(3)
    weight = torch.randn(V_DRAFT, DIM, generator=g)
    prop = Proposer(weight, 2, NanoSpecConfig(k_pre=2, w_max=16), head=kind, hot=hot, target_vocab=V_TARGET)
    # Target ids far above V_DRAFT: the start used to index its counts table with them.
    prompt = torch.cat([hot[-5:], torch.tensor([V_TARGET - 1, 0])])
    topk = hot[torch.randint(0, V_DRAFT, (7, 2), generator=g)]
    prop.start(1, prompt, topk)
    allowed = set(_in_draft(prompt.tolist() + topk.view(-1).tolist(), hot))
    if kind == "full":
        allowed = set(hot.tolist())
    hidden = torch.randn(3, DIM, generator=g)
    out = prop.logits(hidden, torch.tensor([1]))
    ids = out.token_ids(out.logits.argmax(-1, keepdim=True))[:, 0]
    full = hidden @ weight.T  # [3, V_DRAFT]
    row_of = {t: r for r, t in enumerate(hot.tolist())}
    for r in range(3):
        assert ids[r].item() == max(allowed, key=lambda t: full[r, row_of[t]].item())
    assert torch.equal(out.to_vocab().argmax(-1), ids)


def test_a_prompt_with_no_in_draft_token_starts_an_empty_vocabulary_and_still_drafts():
    hot = torch.arange(0, 40)  # the draft knows target ids 0..39 only
    prop = Proposer(torch.randn(40, DIM), 1, NanoSpecConfig(w_max=8), head="packed", hot=hot,
                    target_vocab=V_TARGET)
    prop.start(0, torch.tensor([150, 151, 199]), torch.tensor([[160, 170], [180, 190], [150, 199]]))
    assert prop.dv.active(0).numel() == 0
    out = prop.logits(torch.randn(1, DIM), torch.tensor([0]))
    assert torch.isinf(out.logits).all()
    ids = out.token_ids(out.logits.argmax(-1, keepdim=True))
    assert 0 <= ids.item() < V_TARGET  # a free column's guess: verification rejects it
