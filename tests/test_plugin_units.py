"""NANOSPEC pieces that need no server: registration, settings, the core's head policy, candidate
streams and proposer (``nanospec.policy`` / ``streams`` / ``proposer``), the draft-step id map and the
runtime's prefill / verify / release bookkeeping."""

from __future__ import annotations

import importlib.metadata
import re
import time
from types import SimpleNamespace

import pytest
import torch

from nanospec import NanoSpecConfig, policy, streams
from nanospec.proposer import Proposer, union_columns
from nanospec.sglang.runtime import Runtime, prefill_topk, tail_rows
from nanospec.sglang.settings import Settings, check_against_model, load_settings


def window_vocab(stream: list[int], w: int) -> list[int]:
    return sorted(set(stream[-w:]))


def reference_stream(prompt: list[int], topk: list[list[int]]) -> list[int]:
    seen, tail = set(), []
    for row in topk:
        for t in row:
            if t not in seen:
                seen.add(t)
                tail.append(t)
    return prompt + tail


# -- registration ---------------------------------------------------------------------------------

def test_entry_point_registers_nanospec_with_sglang():
    eps = [ep for ep in importlib.metadata.entry_points(group="sglang.srt.plugins") if ep.name == "nanospec"]
    assert len(eps) == 1 and eps[0].value == "nanospec.sglang:register"
    eps[0].load()()
    eps[0].load()()  # idempotent: SGLang loads plugins again in every process
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    algo = SpeculativeAlgorithm.from_string("nanospec")
    assert algo.name == "NANOSPEC" and algo.is_eagle() and algo.supports_overlap
    # The scheduler calls these on every algorithm; CustomSpecAlgo lacks them.
    assert algo.need_topk() and algo.carries_draft_hidden_states()
    assert callable(algo.create_future_map)
    worker_cls = algo.create_worker(SimpleNamespace(disable_overlap_schedule=True))
    assert worker_cls.__name__ == "NanoSpecWorker"


def test_eagle3_detection_follows_the_draft_config(tmp_path, monkeypatch):
    import sglang.srt.runtime_context as rc

    from nanospec.sglang.algo import NanoSpecAlgo, draft_is_eagle3

    e3, e2 = tmp_path / "e3", tmp_path / "e2"
    for d, arch in ((e3, "LlamaForCausalLMEagle3"), (e2, "LlamaForCausalLMEagle")):
        d.mkdir()
        (d / "config.json").write_text(f'{{"architectures": ["{arch}"]}}')
    assert draft_is_eagle3(str(e3)) and not draft_is_eagle3(str(e2))
    algo = NanoSpecAlgo("NANOSPEC_T", lambda a: None)
    # Every SGLang process asks its own runtime context for the draft: no environment side channel.
    for d, want in ((e3, True), (e2, False)):
        monkeypatch.setattr(rc, "get_spec", lambda d=d: SimpleNamespace(speculative_draft_model_path=str(d)))
        assert algo.is_eagle3() is want
    assert "NANOSPEC_DRAFT_IS_EAGLE3" not in __import__("os").environ


def test_server_arg_overrides_are_logged(caplog):
    from nanospec.sglang.algo import NanoSpecAlgo

    args = SimpleNamespace(speculative_num_steps=None, speculative_eagle_topk=None,
                           speculative_num_draft_tokens=8, max_running_requests=None, device="cpu",
                           disable_overlap_schedule=False, enable_mixed_chunk=True)
    with caplog.at_level("WARNING", logger="nanospec.sglang.seam"):
        NanoSpecAlgo("NANOSPEC_T", lambda a: None).handle_server_args(args)
    tree = (args.speculative_num_steps, args.speculative_eagle_topk, args.speculative_num_draft_tokens)
    assert tree == (3, 1, 8)
    assert args.max_running_requests == 48 and args.disable_overlap_schedule and not args.enable_mixed_chunk
    logged = [r.getMessage() for r in caplog.records]
    for name in ("speculative_num_steps", "speculative_eagle_topk", "max_running_requests",
                 "disable_overlap_schedule", "enable_mixed_chunk"):
        assert sum(m.startswith(f"NANOSPEC sets {name} = ") for m in logged) == 1, name
    assert not any("speculative_num_draft_tokens" in m for m in logged)  # given by the user: kept
    # Nothing to change, nothing logged.
    caplog.clear()
    with caplog.at_level("WARNING", logger="nanospec.sglang.seam"):
        NanoSpecAlgo("NANOSPEC_T", lambda a: None).handle_server_args(args)
    assert not caplog.records


# -- settings ----------------------------------------------------------------------------------

def test_settings_default_to_the_paper_values():
    s = load_settings({})
    assert (s.vocab.k_pre, s.vocab.k_ver, s.vocab.w_max, s.vocab.sources, s.vocab.gather, s.head) == (
        3, 3, 3072, "full", "async", "auto")
    assert s.steps == "auto"  # the cost-aware step controller is on unless pinned
    assert load_settings({"NANOSPEC_STEPS": "Fixed"}).steps == "fixed"


def test_settings_come_from_yaml_then_environment(tmp_path):
    f = tmp_path / "n.yaml"
    f.write_text("nanospec:\n  w_max: 64\n  sources: context\n  head: packed\n")
    s = load_settings({"NANOSPEC_CONFIG": str(f), "NANOSPEC_W_MAX": "32", "NANOSPEC_GATHER": "Indexed"})
    assert (s.vocab.w_max, s.vocab.sources, s.vocab.gather, s.head) == (32, "context", "indexed", "packed")
    assert load_settings({"NANOSPEC_PRE_POSITIONS": "0"}).vocab.pre_positions == 0


@pytest.mark.parametrize("env, words", [
    ({"NANOSPEC_W_MAX": "0"}, "w_max"),
    ({"NANOSPEC_K_VER": "-2"}, "k_ver"),
    ({"NANOSPEC_K_PRE": "three"}, "k_pre"),
    ({"NANOSPEC_PRE_POSITIONS": "-1"}, "pre_positions"),
    ({"NANOSPEC_SOURCES": "prompt"}, "sources"),
    ({"NANOSPEC_GATHER": "sync"}, "gather"),
    ({"NANOSPEC_HEAD": "tiny"}, "head"),
    ({"NANOSPEC_STEPS": "adaptive"}, "steps"),
    ({"NANOSPEC_CONFIG": "/nonexistent/nanospec.yaml"}, "NANOSPEC_CONFIG"),
])
def test_invalid_settings_raise_naming_the_setting(env, words):
    with pytest.raises(ValueError, match=words):
        load_settings(env)


def _launch_args(**kw):
    return SimpleNamespace(**{"speculative_adaptive": False, "speculative_adaptive_config": None,
                              "speculative_num_steps": 3, **kw})


def test_adaptive_flags_are_the_step_controllers_and_a_bad_config_stops_the_launch(tmp_path):
    from nanospec.sglang.algo import check_steps

    auto, fixed = load_settings({}), load_settings({"NANOSPEC_STEPS": "fixed"})
    check_steps(_launch_args(speculative_adaptive=True), auto)  # SGLang's flag: NanoSpec's controller
    with pytest.raises(ValueError, match="NANOSPEC_STEPS=fixed"):
        check_steps(_launch_args(speculative_adaptive=True), fixed)
    f = tmp_path / "adaptive.json"
    f.write_text('{"1": {"candidate_steps": [0, 4]}}')
    with pytest.raises(ValueError, match="exceeds --speculative-num-steps 3"):
        check_steps(_launch_args(speculative_adaptive_config=str(f)), auto)
    f.write_text('{"probe_every": -1, "1": {"candidate_steps": [0, 1]}}')
    with pytest.raises(ValueError, match="probe_every"):
        check_steps(_launch_args(speculative_adaptive_config=str(f)), auto)


def test_cpu_launch_turns_off_decode_graphs_for_the_step_states(caplog):
    from sglang.srt.model_executor.cuda_graph_config import Backend, default_cuda_graph_config

    from nanospec.sglang.algo import NanoSpecAlgo

    args = SimpleNamespace(speculative_num_steps=3, speculative_eagle_topk=1, speculative_num_draft_tokens=4,
                           max_running_requests=4, device="cpu", disable_overlap_schedule=True,
                           enable_mixed_chunk=False, cuda_graph_config=default_cuda_graph_config())
    assert args.cuda_graph_config.decode.backend != Backend.DISABLED
    with caplog.at_level("WARNING", logger="nanospec.sglang.seam"):
        NanoSpecAlgo("NANOSPEC_T", lambda a: None).handle_server_args(args)
    assert args.cuda_graph_config.decode.backend == Backend.DISABLED
    assert any(r.getMessage().startswith("NANOSPEC sets cuda_graph_config") for r in caplog.records)


def test_unknown_yaml_key_is_rejected(tmp_path):
    f = tmp_path / "n.yaml"
    f.write_text("wmax: 3\n")
    with pytest.raises(ValueError, match="unknown keys"):
        load_settings({"NANOSPEC_CONFIG": str(f)})


def test_settings_checked_against_the_model():
    check_against_model(Settings(), vocab_size=512, eagle_topk=4)
    with pytest.raises(ValueError, match="k_ver=600 exceeds the vocabulary size 512"):
        check_against_model(Settings(vocab=NanoSpecConfig(k_ver=600)), vocab_size=512, eagle_topk=1)
    with pytest.raises(ValueError, match="w_max=2 is smaller than --speculative-eagle-topk=4"):
        check_against_model(Settings(vocab=NanoSpecConfig(w_max=2)), vocab_size=512, eagle_topk=4)


# -- per-batch head policy --------------------------------------------------------------------------

LLAMA = {"vocab": 128256, "w_max": 3072, "dim": 4096, "elem": 2}


def test_policy_packs_few_requests():
    assert policy.choose_head(batch=1, rows=1, union_size=3072, **LLAMA) == "packed"
    assert policy.choose_head(batch=8, rows=8, union_size=8 * 3072, **LLAMA) == "packed"


def test_policy_switches_to_full_head_near_v_over_w_requests():
    # Without overlap the break-even is V / W_max = 41.75 requests.
    assert policy.choose_head(batch=40, rows=40, union_size=40 * 3072, **LLAMA) == "packed"
    assert policy.choose_head(batch=44, rows=44, union_size=44 * 3072, **LLAMA) == "full"


def test_policy_uses_the_union_when_vocabularies_overlap():
    assert policy.choose_head(batch=64, rows=64, union_size=6000, **LLAMA) == "union"
    assert policy.choose_head(batch=16, rows=16, union_size=4000, **LLAMA) == "union"


def test_policy_honours_a_forced_head():
    assert policy.choose_head(batch=1, rows=1, union_size=1, forced="full", **LLAMA) == "full"


def test_union_estimate_learns_the_overlap_ratio():
    est = policy.UnionEstimate()
    assert est.estimate(4, 100) == 400
    est.observe(100, 4, 100)
    assert est.estimate(8, 100) == 200


# -- candidate streams ------------------------------------------------------------------------------

def test_missing_prefix_rows_leave_the_stream_as_prompt_plus_computed_candidates():
    prompt = [5, 6, 7, 8, 9]
    rows = torch.tensor([[20, 21], [21, 22], [6, 23]])  # positions 2..4 only (2 tokens cached)
    full = streams.fill_missing_rows(rows, 2)
    assert full.shape == (5, 2)
    prop = Proposer(torch.randn(32, 4), 2, NanoSpecConfig(w_max=16))
    prop.start(1, torch.tensor(prompt), full)
    expected = window_vocab(reference_stream(prompt, rows.tolist()), 16)
    assert prop.dv.active(1).tolist() == expected


@pytest.mark.parametrize("sources", ["full", "context", "extension"])
def test_start_args_keep_the_chosen_sources(sources):
    ids, topk = torch.tensor([1, 2, 3]), torch.tensor([[4, 5], [6, 7], [8, 9]])
    prompt, tk = streams.start_args(ids, topk, sources, 3)
    tokens = set(prompt.tolist()) | (set() if tk is None else set(tk.reshape(-1).tolist()))
    want = {"full": set(range(1, 10)), "context": {1, 2, 3}, "extension": set(range(4, 10))}[sources]
    assert tokens == want


def test_start_args_take_top_k_from_the_last_positions_only():
    ids, topk = torch.tensor([1, 2, 3]), torch.tensor([[4, 5], [6, 7], [8, 9]])
    assert streams.start_args(ids, topk, "full", 1)[1].tolist() == [[-1, -1], [-1, -1], [8, 9]]
    assert (streams.start_args(ids, topk, "full", 0)[1] == -1).all()
    assert streams.start_args(ids, topk, "full", 5)[1] is topk
    prop = Proposer(torch.randn(16, 4), 1, NanoSpecConfig(w_max=16, pre_positions=1))
    prop.start(0, ids, topk)
    assert prop.dv.active(0).tolist() == [1, 2, 3, 8, 9]


def test_tail_rows_are_the_last_positions_of_each_extend():
    assert tail_rows([5, 2, 7], 14, 3).tolist() == [2, 3, 4, 5, 6, 11, 12, 13]
    assert tail_rows([5, 2], 7, 0).tolist() == []
    assert tail_rows([2, 3], 5, 3) is None  # every extend short enough: all rows, no gather
    assert tail_rows([5, 2], 9, 3) is None  # lengths that do not match the rows: all rows
    assert tail_rows(None, 9, 3) is None


def test_prefill_topk_runs_the_head_on_the_chosen_rows_only():
    w, h = torch.randn(40, 8), torch.randn(7, 8)
    seen = []
    got = prefill_topk(h, lambda x: seen.append(x.shape[0]) or x @ w.T, 40, 3, torch.tensor([1, 5, 6]))
    assert seen == [3]
    full = (h @ w.T).topk(3, dim=-1).indices
    assert torch.equal(got[[1, 5, 6]], full[[1, 5, 6]]) and (got[[0, 2, 3, 4]] == -1).all()


def test_verify_candidates_are_tree_tokens_then_topk_of_the_accepted_path():
    # 2 requests, tree of T=4 nodes, S1=3; request 0 accepted 2 nodes, request 1 only the root.
    draft = torch.tensor([10, 11, 12, 13, 20, 21, 22, 23])
    accept_index = torch.tensor([[0, 1, -1], [4, -1, -1]])
    logits = torch.full((8, 50), -1.0)
    for row, toks in {0: [30, 31], 1: [32, 33], 4: [40, 41]}.items():
        logits[row, toks[0]], logits[row, toks[1]] = 5.0, 4.0
    predict = torch.tensor([11, 32, 0, 0, 40, 0, 0, 0])
    emitted, ok = streams.emitted_tokens(predict, torch.tensor([2, 1]), 2, 3)
    assert emitted.tolist() == [[11, 32, 0], [40, 0, 0]]
    assert ok.tolist() == [[True, True, False], [True, False, False]]
    cands, valid = streams.verify_candidates(draft_tokens=draft, accept_index=accept_index, logits=logits,
                                             vocab=50, k_ver=2, emitted=emitted, emitted_valid=ok,
                                             sources="full")
    assert cands[0][valid[0]].tolist() == [10, 11, 12, 13, 30, 31, 32, 33]
    assert cands[1][valid[1]].tolist() == [20, 21, 22, 23, 40, 41]
    ctx, ctx_ok = streams.verify_candidates(draft_tokens=draft, accept_index=accept_index, logits=logits,
                                            vocab=50, k_ver=2, emitted=emitted, emitted_valid=ok,
                                            sources="context")
    assert ctx[ctx_ok].tolist() == [11, 32, 40]


def test_target_ids_outside_a_reduced_draft_vocabulary_are_dropped():
    t2d = torch.tensor([-1, 0, -1, 1])  # draft rows hold target ids 1 and 3
    rows, ok = streams.to_draft_space(torch.tensor([[3, 2, 1, 0]]), torch.ones(1, 4, dtype=torch.bool), t2d)
    assert ok.tolist() == [[True, False, True, False]] and rows[ok].tolist() == [1, 0]


def test_prefill_topk_matches_the_full_logits_in_chunks(monkeypatch):
    from nanospec.sglang import memory

    monkeypatch.setattr(memory, "PREFILL_TOPK_BYTES", 3 * 40 * 4)  # chunks of 3 rows
    w, h = torch.randn(40, 8), torch.randn(7, 8)
    got = prefill_topk(h, lambda x: torch.cat([x @ w.T, torch.full((x.shape[0], 5), 1e9)], 1), 40, 3)
    assert torch.equal(got, (h @ w.T).topk(3, dim=-1).indices)


# -- proposer (the core's draft head) ---------------------------------------------------------------

def _head(kind: str, w_max=8, hot=None, target_vocab=None, vocab=64, dim=16):
    torch.manual_seed(0)
    head = Proposer(torch.randn(vocab, dim), 4, NanoSpecConfig(w_max=w_max), head=kind, hot=hot,
                    target_vocab=target_vocab)
    head.start(1, torch.tensor([3, 9, 12]), torch.tensor([[5, 3], [9, 40], [41, 3]]))
    head.start(2, torch.tensor([7, 7, 50]), None)
    return head


@pytest.mark.parametrize("kind", ["packed", "union", "full"])
def test_each_head_proposes_the_best_token_of_its_vocabulary(kind):
    head = _head(kind)
    reqs = torch.tensor([1, 2])
    hidden = torch.randn(4, 16)  # two rows per request (topk = 2 draft rows)
    out = head.logits(hidden, reqs)
    assert out.kind == kind
    ids = out.token_ids(out.logits.argmax(-1, keepdim=True))[:, 0]
    full = hidden @ head.weight.T
    vocab = {1: [3, 5, 9, 12, 40, 41], 2: [7, 50]}
    allowed = {"packed": [vocab[1], vocab[1], vocab[2], vocab[2]],
               "union": [sorted(vocab[1] + vocab[2])] * 4,
               "full": [list(range(64))] * 4}[kind]
    for r in range(4):
        best = max(allowed[r], key=lambda t: full[r, t].item())
        assert ids[r].item() == best
    # draft-extend keeps its top-k beyond the call: logits go back to vocabulary positions
    scattered = out.to_vocab()
    assert scattered.shape == (4, 64) and torch.equal(scattered.argmax(-1), ids)


def test_column_map_belongs_to_its_own_logits_not_to_the_last_call():
    # Two calls with the slots in opposite orders, looked up in the opposite order: each map still
    # answers for its own logits (the old DraftHead.token_ids read the last call's slots).
    head = _head("packed")
    h1, h2 = torch.randn(2, 16), torch.randn(2, 16)
    first = head.logits(h1, torch.tensor([1, 2]))
    second = head.logits(h2, torch.tensor([2, 1]))
    vocab = {1: [3, 5, 9, 12, 40, 41], 2: [7, 50]}
    for out, h, slots in ((first, h1, (1, 2)), (second, h2, (2, 1))):
        full = h @ head.weight.T
        got = out.token_ids(out.logits.argmax(-1, keepdim=True))[:, 0].tolist()
        assert got == [max(vocab[s], key=lambda t: full[r, t].item()) for r, s in enumerate(slots)]


def test_token_ids_of_a_tree_expanded_top_k_follow_the_logits_rows():
    head = _head("packed")
    out = head.logits(torch.randn(2, 16), torch.tensor([1, 2]))
    cols = out.logits.topk(2, dim=-1).indices  # [2, 2]
    expanded = cols.repeat_interleave(2, dim=0)  # SGLang's tree repeats each row topk times
    assert torch.equal(out.token_ids(expanded), out.token_ids(cols).repeat_interleave(2, dim=0))


def test_union_columns_are_the_distinct_active_tokens():
    col_tok = torch.tensor([[5, -1, 3], [3, 9, -1]], dtype=torch.int32)
    assert union_columns(col_tok, 16, 5).tolist() == [3, 5, 9, -1, -1]


def test_reduced_draft_vocabulary_maps_rows_back_to_target_ids():
    hot = torch.arange(64) * 2  # draft row r is target token 2r
    head = _head("packed", hot=hot, target_vocab=128)
    out = head.logits(torch.randn(2, 16), torch.tensor([1, 2]))
    ids = out.token_ids(out.logits.argmax(-1, keepdim=True))
    assert all(i % 2 == 0 for i in ids.view(-1).tolist())
    assert out.to_vocab().shape == (2, 128)


def test_unknown_head_is_rejected():
    with pytest.raises(ValueError, match="head must be one of"):
        Proposer(torch.randn(8, 4), 1, NanoSpecConfig(w_max=4), head="tiny")


# -- the draft step's id map (SGLang's hot_token_id) ------------------------------------------------

def test_id_map_maps_only_columns_of_the_last_draft_logits():
    from nanospec.sglang.hooks import IdMap

    head = _head("packed")
    ids = IdMap(head.out_vocab)
    entry = torch.tensor([[12], [50]])  # draft-extend's top-k: vocabulary ids already
    assert ids[entry] is entry  # nothing pending: passed through
    out = head.logits(torch.randn(2, 16), torch.tensor([1, 2]))
    ids.expect(out)
    cols = out.logits.argmax(-1, keepdim=True)
    assert torch.equal(ids[cols], out.token_ids(cols))
    assert ids[cols] is cols  # consumed: a second lookup has no logits to map
    ids.expect(out)
    ids.clear()  # a new draft pass
    assert ids[entry] is entry
    assert len(ids) == 64 and ids.shape == (64,)


# -- runtime ----------------------------------------------------------------------------------------

def _req(rid, ids, slot):
    return SimpleNamespace(rid=rid, full_untruncated_fill_ids=ids, kv=SimpleNamespace(req_pool_idx=slot))


def _runtime(**cfg):
    torch.manual_seed(1)
    return Runtime(torch.randn(64, 8), 4, Settings(vocab=NanoSpecConfig(**cfg)), target_vocab=64)


def _whole_and_chunked(ids: list[int], whole: torch.Tensor, chunks: torch.Tensor, **cfg):
    """Streams of one prompt prefilled at once (top-k rows ``whole``) and in chunks of 4 and 2 (rows
    ``chunks``, as the prefill hook stashes them): (whole's active tokens, the chunked runtime)."""
    one, two = _runtime(**cfg), _runtime(**cfg)
    one.stash_prefill_topk(whole)
    one.start_batch(SimpleNamespace(reqs=[_req("a", ids, 1)], prefix_lens=[0], extend_lens=[6]))
    req = _req("a", ids, 2)
    two.stash_prefill_topk(chunks[:4])
    two.start_batch(SimpleNamespace(reqs=[req], prefix_lens=[0], extend_lens=[4], chunked_req=req))
    two.stash_prefill_topk(chunks[4:])
    two.start_batch(SimpleNamespace(reqs=[req], prefix_lens=[4], extend_lens=[2], chunked_req=None))
    return one.proposer.dv.active(1).tolist(), two


def test_chunked_prefill_builds_the_same_stream_as_one_chunk():
    ids = [3, 4, 5, 6, 7, 8]
    topk = torch.tensor([[10, 11], [12, 10], [13, 14], [15, 11], [16, 17], [18, 19]])
    whole, two = _whole_and_chunked(ids, topk, topk, w_max=9)
    assert whole == two.proposer.dv.active(2).tolist()
    assert whole == window_vocab(reference_stream(ids, topk.tolist()), 9)
    assert two.starts == 1  # a continued chunk is the same request


def test_chunked_prefill_keeps_the_last_positions_top_k_across_chunks():
    # pre_positions 3 over a 6-token prompt in chunks of 4 and 2: the prefill hook computes each
    # chunk's last 3 rows (-1 elsewhere); the prompt's last 3 take one row from the first chunk.
    ids = [3, 4, 5, 6, 7, 8]
    topk = torch.tensor([[10, 11], [12, 10], [13, 14], [15, 11], [16, 17], [18, 19]])
    hooked = topk.clone()
    hooked[0] = -1
    whole, two = _whole_and_chunked(ids, topk, hooked, w_max=9, pre_positions=3)
    assert whole == two.proposer.dv.active(2).tolist()
    assert whole == window_vocab(reference_stream(ids, topk[3:].tolist()), 9)


def test_prefill_without_target_topk_is_an_error():
    rt = _runtime()
    with pytest.raises(RuntimeError, match="prefill top-k"):
        rt.start_batch(SimpleNamespace(reqs=[_req("a", [1, 2], 1)], prefix_lens=[0], extend_lens=[2]))


def test_verify_step_records_hits_extends_and_release_reports():
    rt = _runtime(w_max=32, k_ver=1)
    rt.stash_prefill_topk(torch.tensor([[20], [21]]))
    rt.start_batch(SimpleNamespace(reqs=[_req("a", [1, 2], 3)], prefix_lens=[0], extend_lens=[2]))
    logits = torch.zeros(2, 64)
    logits[0, 33], logits[1, 34] = 1.0, 1.0
    # tree [2, 21], both accepted; emitted 21 (in the vocabulary) and the bonus 34 (not in it)
    rt.after_verify(reqs=torch.tensor([3]), draft_tokens=torch.tensor([2, 21]),
                    accept_index=torch.tensor([[0, 1]]), accept_lens=torch.tensor([2]),
                    predict=torch.tensor([21, 34]), logits=logits)
    assert {33, 34} <= set(rt.proposer.dv.active(3).tolist())
    stats = rt.release(3)
    assert stats == {"mean_active_vocab": 4.0, "hit_rate": 0.5, "draft_steps": 1.0}
    assert rt.release(3) is None  # idempotent
    assert float(rt.stats.dev[3].abs().sum()) == 0.0


def test_every_shipped_launch_config_loads():
    from pathlib import Path

    files = sorted((Path(__file__).resolve().parents[1] / "configs" / "nanospec").glob("*.yaml"))
    assert len(files) >= 4
    loaded = {f.stem: load_settings({"NANOSPEC_CONFIG": str(f)}) for f in files}
    assert loaded["default"] == Settings()
    assert loaded["ablation_context"].vocab.sources == "context"
    assert loaded["tiny_window"].vocab.w_max == 16


def test_draft_timer_logs_median_and_mean_of_all_calls(caplog):
    from nanospec.sglang.telemetry import DraftTimer

    # One slow first call (a compile) moves the mean, not the median the benchmark reads.
    durations = iter([0.5] + [0.01] * 9)

    def original(worker):
        time.sleep(next(durations))
        return "out"

    timer = DraftTimer(every=10)
    with caplog.at_level("WARNING", logger="nanospec.timing"):
        assert all(timer(original, None) == "out" for _ in range(10))
    (msg,) = [r.getMessage() for r in caplog.records if "NANOSPEC timing" in r.getMessage()]
    median, mean = (float(x) for x in re.findall(r"([0-9.]+) ms (?:median|mean)", msg))
    assert 10 <= median < 60 and mean > 55 and msg.endswith("over 10 calls")
