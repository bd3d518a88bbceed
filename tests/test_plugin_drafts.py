"""Bring your own draft: NANOSPEC serves the draft layouts SGLang's EAGLE3/EAGLE serve (issue 26's matrix).

Each layout of ``CASES`` is a tiny agreeing pair (``tests/support/draft_layouts.py``: the target maps
token i to i + 1 and the draft predicts exactly that) rewritten the way published drafts are stored.
The agreeing pair makes the layout checkable through a server: a weight that lands in the wrong place,
or a row map that is off, lowers the accept length below SGLang's own with the same draft.

Per case two servers, SGLang's own algorithm (EAGLE3, or EAGLE for an EAGLE-2 draft) and NANOSPEC
(packed head over each request's vocabulary): greedy outputs equal plain decoding's token for token
(the agreeing target's chain, computed here), and NANOSPEC's mean accept
length is at least 97% of SGLang's. Properties are spread over the cases so each server start covers
several (docs/plugin.md, "Bring your own draft", has the table). The full-vocabulary untied EAGLE-3
Llama draft and the EAGLE-2 draft without a token map are the other server tests' drafts
(test_plugin_server.py, test_plugin_eagle2.py).

Then drafts NANOSPEC cannot serve: refused in the launching process, with the field and the file named.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from nanospec.draft_format import DraftFormatError
from nanospec.sglang.drafts import EAGLE3_ARCHS, EAGLE_ARCHS, check_draft
from tests.plugin_support import PROMPTS, generate_all, output_ids, server, spec_args
from tests.support.draft_layouts import make_target, rewrite, save_token_map
from tests.support.tiny_models import make_tiny_eagle3_draft, make_tiny_eagle_draft

V = 512
NEW = 24
TREE = ["--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
        "--speculative-num-draft-tokens", "4"]
# The fixed chain: accept lengths are compared with SGLang's at the same tree (the step controller would
# run other step counts while it learns).
NANO_ENV = {"NANOSPEC_HEAD": "packed", "NANOSPEC_W_MAX": "256", "NANOSPEC_STEPS": "fixed"}
# The agreeing draft's answer to token t is t + 1. NANOSPEC can propose it only once it is in the
# request's vocabulary (the prompt, the target's top-k), so the acceptance comparison uses prompts that
# hold their own continuation (a chain, one across the vocabulary's end): there the heads are compared,
# not the vocabularies. The text prompts, whose continuation is new, check losslessness only.
IN_CONTEXT = [list(range(100, 140)) + [99], list(range(490, V)) + list(range(0, 20)) + [489],
              list(range(300, 340)) + [299]]
MIXED = IN_CONTEXT + [PROMPTS[2], PROMPTS[4]]
# A reduced head keeps 3 ids of every 4: the chains above cross ids it cannot propose.
KEEP = torch.tensor([i for i in range(V) if i % 4 != 3])

# name: (target architecture, draft kind, rewrite options, token map)
CASES = {
    "llama-eagle3-reduced-bin": ("llama", "eagle3", {"keep": KEEP, "storage": "bin"}, False),
    "llama-eagle3-tied-defaults-bf16-sharded": (
        "llama", "eagle3",
        {"tied": True, "eagle_config": False, "dtype": torch.bfloat16, "storage": "sharded"}, False),
    "llama-eagle2-token-map": ("llama", "eagle2", None, True),
    "qwen2-eagle3-reduced-bf16": ("qwen2", "eagle3", {"keep": KEEP, "dtype": torch.bfloat16}, False),
    "qwen3-eagle3-full": ("qwen3", "eagle3", {}, False),
}


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("drafts")


def _target(root: Path, arch: str) -> Path:
    path = root / f"target_{arch}"
    return path if (path / "model.safetensors").is_file() else make_target(path, arch, vocab_size=V)


def _draft(root: Path, name: str) -> tuple[Path, list[str]]:
    """The case's draft directory and the draft arguments of its servers."""
    arch, kind, options, token_map = CASES[name]
    target = _target(root, arch)
    if kind == "eagle2":
        draft = make_tiny_eagle_draft(root / name, target, agree=True)
    else:
        base = make_tiny_eagle3_draft(root / f"{name}_base", target, agree=True)
        draft = rewrite(base, root / name, **options)
    args = []
    if token_map:
        args = ["--speculative-token-map", str(save_token_map(root / f"{name}_map.pt", KEEP))]
    return draft, args


def _reference(target: Path) -> list[list[int]]:
    """Plain decoding's greedy answer to each of ``MIXED``: the agreeing target maps every token t to t + 1
    whatever precedes it (test_plugin_eagle2 checks the chain against plain greedy decoding), so the
    answer continues from the prompt's last token."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(target))
    last = [p[-1] if isinstance(p, list) else tok(p)["input_ids"][-1] for p in MIXED]
    return [[(t + i) % V for i in range(1, NEW + 1)] for t in last]


@pytest.fixture(scope="module", params=list(CASES))
def served(request, root, tmp_path_factory):
    """(case name, plain outputs, SGLang's responses, NANOSPEC's one at a time, NANOSPEC's batched)."""
    name = request.param
    arch, kind, _, _ = CASES[name]
    logs = tmp_path_factory.mktemp(f"logs_{name}")
    draft, extra = _draft(root, name)
    algo = "EAGLE3" if kind == "eagle3" else "EAGLE"
    target = _target(root, arch)
    plain = _reference(target)
    with server(target, spec_args(algo, draft) + TREE + extra, logs, algo.lower()) as srv:
        own = [srv.generate(p, max_new_tokens=NEW) for p in MIXED]
    with server(target, spec_args("NANOSPEC", draft) + TREE + extra, logs, "nanospec", env=NANO_ENV) as srv:
        alone = [srv.generate(p, max_new_tokens=NEW) for p in MIXED]
        together = generate_all(srv, MIXED, concurrent=True, max_new_tokens=NEW)
    return name, plain, own, alone, together


def _accept(responses) -> list[float]:
    """Accept length of each in-context prompt's response."""
    return [r["meta_info"]["spec_accept_length"] for r in responses[:len(IN_CONTEXT)]]


def test_every_layout_is_served_losslessly_by_sglang_and_nanospec(served):
    name, plain, own, alone, together = served
    assert [output_ids(r) for r in own] == plain, f"{name}: SGLang's own algorithm differs from plain"
    assert [output_ids(r) for r in alone] == plain, f"{name}: NANOSPEC differs from plain"
    assert [output_ids(r) for r in together] == plain, f"{name}: batched NANOSPEC differs from plain"


def test_nanospec_accepts_at_least_97_percent_of_sglangs_own_algorithm(served):
    name, _, own, alone, together = served
    assert min(_accept(own)) > 2.0, f"{name}: the agreeing draft is not accepted by SGLang itself"
    for mine in (_accept(alone), _accept(together)):
        assert all(a >= 0.97 * b for a, b in zip(mine, _accept(own), strict=True)), (name, mine, _accept(own))
    for r in alone + together:
        assert 0 < r["meta_info"]["nanospec_mean_active_vocab"] <= 256


# -- drafts NANOSPEC refuses ------------------------------------------------------------------------


def test_the_listed_eagle_architectures_are_the_ones_sglang_registers():
    from sglang.srt.models.registry import ModelRegistry

    known = set(ModelRegistry.get_supported_archs())
    assert set(EAGLE3_ARCHS + EAGLE_ARCHS) <= known


def _edit_config(draft: Path, **changes) -> Path:
    cfg = json.loads((draft / "config.json").read_text())
    cfg.update(changes)
    (draft / "config.json").write_text(json.dumps(cfg))
    return draft


def _bad_drafts(root: Path) -> dict[str, tuple[Path, str]]:
    """name: (draft directory, what the refusal must say)."""
    target = _target(root, "llama")
    base = make_tiny_eagle3_draft(root / "bad_base", target, agree=True)
    plain_arch = _edit_config(rewrite(base, root / "bad_arch"), architectures=["LlamaForCausalLM"])
    short_d2t = rewrite(base, root / "bad_d2t", keep=KEEP)
    from safetensors.torch import load_file, save_file

    state = load_file(str(short_d2t / "model.safetensors"))
    state["d2t"] = state["d2t"][:-10].clone()
    save_file(state, str(short_d2t / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((target / "config.json").read_text())
    small = root / "bad_hidden_target"
    if not small.exists():
        from nanospec.testing import make_tiny_llama

        make_tiny_llama(small, vocab_size=V, hidden=32, heads=4, kv_heads=2, intermediate=64, agree=True)
    wrong_hidden = make_tiny_eagle3_draft(root / "bad_hidden", small, agree=True)
    assert cfg["hidden_size"] != 32
    return {
        "architecture": (plain_arch, "architectures ['LlamaForCausalLM'] is not an EAGLE draft"),
        "d2t_size": (short_d2t, "d2t has shape (374,), but the draft head has 384 rows"),
        "hidden_size": (wrong_hidden, "the draft reads target hidden states of size 32"),
    }


@pytest.fixture(scope="module")
def bad_drafts(root):
    return _bad_drafts(root)


@pytest.mark.parametrize("case", ["architecture", "d2t_size", "hidden_size"])
def test_check_draft_names_the_field_and_the_file(bad_drafts, root, case):
    draft, message = bad_drafts[case]
    target_cfg = json.loads((_target(root, "llama") / "config.json").read_text())
    with pytest.raises(DraftFormatError, match="^" + str(draft)) as e:
        check_draft(draft, target_cfg)
    assert message in str(e.value)


def test_check_draft_refuses_a_token_map_outside_the_vocabulary(root):
    target = _target(root, "llama")
    draft = make_tiny_eagle_draft(root / "map_draft", target)
    bad = save_token_map(root / "bad_map.pt", torch.tensor([1, 2, V + 5]))
    cfg = json.loads((target / "config.json").read_text())
    with pytest.raises(DraftFormatError, match="--speculative-token-map .*bad_map.pt: token ids outside"):
        check_draft(draft, cfg, token_map=bad)
    assert check_draft(draft, cfg, token_map=save_token_map(root / "ok_map.pt", KEEP)).head_rows == len(KEEP)


def test_a_draft_nanospec_cannot_serve_stops_the_launch(bad_drafts, root, tmp_path):
    # One launch shows check_draft's refusal stops the server; the refusals themselves are the test above.
    case = "d2t_size"
    draft, message = bad_drafts[case]
    srv = server(_target(root, "llama"), spec_args("NANOSPEC", draft) + TREE, tmp_path, case)
    srv.startup_timeout = 240
    with pytest.raises(RuntimeError, match="exited"):
        srv.start()
    log = srv.log_text()
    assert message in log and str(draft) in log
