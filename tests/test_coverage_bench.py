"""The coverage analysis (nanospec.bench.coverage) on hand-made traces and tiny local models."""

from __future__ import annotations

import gzip
import json
import random

import numpy as np
import pytest
import torch

from nanospec import DynamicVocab, NanoSpecConfig
from nanospec.bench import coverage as cov
from tests.support.tiny_models import agree_next_token, make_tiny_llama


def make_vocab(V: int, w_max: int, k: int = 2) -> DynamicVocab:
    return DynamicVocab(torch.randn(V, 4), 1, NanoSpecConfig(k_pre=k, k_ver=k, w_max=w_max), backend="torch")


def reference_coverage(trace: cov.Trace, w_max: int) -> tuple[list[bool], list[int]]:
    """The definition in plain Python: the stream is the prompt, the prefill top-K (row-major, repeats
    removed), then per token [token, top-K] with repeats in the row removed; active = distinct tokens
    of the last w_max entries."""
    stream = list(trace.prompt.tolist())
    seen = set()
    for t in trace.prompt_topk.reshape(-1).tolist():
        if t not in seen:
            seen.add(t)
            stream.append(t)
    hits, sizes = [], []
    for i, tok in enumerate(trace.tokens.tolist()):
        active = set(stream[-w_max:])
        if i > 0:
            hits.append(tok in active)
            sizes.append(len(active))
        row = []
        for t in [tok, *trace.step_topk[i].tolist()]:
            if t not in row:
                row.append(t)
        stream += row
    return hits, sizes


def test_dynamic_coverage_of_a_hand_made_trace():
    # V=20. Prompt [1, 2], prefill top-2 [[3, 4], [5, 3]] -> stream 1 2 3 4 5 (vocab {1..5}).
    trace = cov.Trace(prompt=torch.tensor([1, 2]), prompt_topk=torch.tensor([[3, 4], [5, 3]]),
                      tokens=torch.tensor([5, 6, 2, 9]),
                      step_topk=torch.tensor([[5, 6], [6, 7], [2, 9], [9, 1]]))
    hits, sizes = cov.dynamic_coverage(trace, make_vocab(20, w_max=64))
    # token 5: prefill output, not counted; after it the vocab gains 6 -> token 6 covered (size 6);
    # then 7 -> token 2 covered (size 7); then 9 -> token 9 covered (size 8).
    assert hits.tolist() == [True, True, True] and sizes.tolist() == [6, 7, 8]
    # A window of 3 keeps only the last 3 stream entries: 3 4 5 -> (+5 6) {5, 6}: token 6 hit, size 2;
    # (+6 7) {6, 7}: token 2 missed, size 2; (+2 9) {7, 2, 9}: token 9 hit, size 3.
    hits, sizes = cov.dynamic_coverage(trace, make_vocab(20, w_max=3))
    assert hits.tolist() == [True, False, True] and sizes.tolist() == [2, 2, 3]


@pytest.mark.parametrize("w_max", [1, 5, 17, 4096])
def test_dynamic_coverage_matches_plain_reference_on_random_traces(w_max):
    rng = random.Random(w_max)
    V, k = 40, 3
    vocab = make_vocab(V, w_max, k)
    for _ in range(5):
        L, n = rng.randint(1, 12), rng.randint(1, 40)
        trace = cov.Trace(
            prompt=torch.tensor([rng.randrange(V) for _ in range(L)]),
            prompt_topk=torch.tensor([rng.sample(range(V), k) for _ in range(L)]),
            tokens=torch.tensor([rng.randrange(V) for _ in range(n)]),
            step_topk=torch.tensor([rng.sample(range(V), k) for _ in range(n)]),
        )
        hits, sizes = cov.dynamic_coverage(trace, vocab)  # the slot is reused: start() must reset it
        ref_hits, ref_sizes = reference_coverage(trace, w_max)
        assert hits.tolist() == ref_hits and sizes.tolist() == ref_sizes


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = make_tiny_llama(tmp_path_factory.mktemp("tiny"), vocab_size=320, hidden=32, layers=2, heads=2,
                           kv_heads=1, intermediate=64, seed=1)
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    return path, model, AutoTokenizer.from_pretrained(str(path))


def test_greedy_trace_matches_transformers_generate(tiny):
    _, model, _ = tiny
    prompt = torch.tensor([0, 17, 45, 200, 9])
    trace = cov.greedy_trace(model, prompt, 12, eos_ids=set(), k_pre=3, k_ver=4)
    out = model.generate(prompt[None], max_new_tokens=12, min_new_tokens=12, do_sample=False,
                         output_logits=True, return_dict_in_generate=True)
    assert torch.equal(trace.tokens, out.sequences[0, len(prompt):])
    ref_topk = torch.stack([lg[0].topk(4).indices for lg in out.logits])
    assert torch.equal(trace.step_topk, ref_topk)
    full = model(prompt[None]).logits[0]
    assert torch.equal(trace.prompt_topk, full.topk(3, dim=-1).indices)
    assert torch.equal(trace.prompt_topk[-1], trace.step_topk[0, :3])


def test_greedy_trace_stops_at_eos(tiny):
    _, model, _ = tiny
    prompt = torch.tensor([0, 17, 45])
    free = cov.greedy_trace(model, prompt, 6, eos_ids=set(), k_pre=1, k_ver=1)
    stop_at = int(free.tokens[2])
    cut = cov.greedy_trace(model, prompt, 6, eos_ids={stop_at}, k_pre=1, k_ver=1)
    first = free.tokens.tolist().index(stop_at)
    assert cut.tokens.tolist() == free.tokens.tolist()[: first + 1]


def test_static_frequency_rank_and_coverage_counts():
    counts = np.array([5, 0, 9, 5, 1])
    rank = cov.frequency_rank(counts)
    assert rank.tolist() == [1, 4, 0, 2, 3]  # 2 first, then 0 and 3 (tie by id), then 4, then 1
    tokens = np.array([2, 2, 0, 4, 1, 3])
    hits = [True, False, True, True, False, True]  # NanoSpec covered 4 of 6
    row = cov.summarize(hits, [10, 11, 12, 13, 14, 15], rank[tokens], ks=(1, 2, 3, 5))
    assert row["tokens"] == 6 and row["nanospec_coverage"] == pytest.approx(4 / 6)
    assert row["nanospec_mean_vocab"] == pytest.approx(12.5)
    assert row["static_coverage"] == pytest.approx({"1": 2 / 6, "2": 3 / 6, "3": 4 / 6, "5": 1.0})
    assert row["static_k_for_same_coverage"] == 3


def test_token_counts_adds_one_eos_per_turn(tiny):
    _, _, tok = tiny
    texts = ["the quick brown fox", "the lazy dog"]
    counts = cov.token_counts(tok, texts, len(tok), tok.eos_token_id)
    ids = [t for s in texts for t in tok(s, add_special_tokens=False)["input_ids"]]
    expect = np.bincount(ids, minlength=len(tok))
    expect[tok.eos_token_id] += 2
    assert counts.tolist() == expect.tolist()


def write_inputs(tmp_path, categories: list[str]):
    q = tmp_path / "q.jsonl"
    q.write_text("".join(json.dumps({"question_id": i, "category": c, "turns": [f"tell me about the {c}",
                                                                                 "and then?"]}) + "\n"
                         for i, c in enumerate(categories)))
    corpus = tmp_path / "c.json.gz"
    convs = [{"id": str(i), "conversations": [{"from": "human", "value": "hi"},
                                              {"from": "gpt", "value": f"the weather today {i} is sunny"}]}
             for i in range(6)]
    with gzip.open(corpus, "wt") as f:
        json.dump(convs, f)
    return q, corpus


def test_agreeing_model_end_to_end_numbers(tmp_path):
    """The agreeing target emits t+1, t+2, ... after a prompt ending in t, so which generated tokens the
    dynamic vocabulary holds is known: token p+j is covered iff it is within the stream before step j."""
    path = make_tiny_llama(tmp_path / "agree", vocab_size=320, hidden=32, layers=2, heads=2, kv_heads=1,
                           intermediate=64, agree=True)
    q, corpus = write_inputs(tmp_path, ["alpha", "beta", "alpha"])
    out = tmp_path / "out"
    assert cov.main(["--model", str(path), "--questions", str(q), "--max-new-tokens", "9",
                     "--corpus", str(corpus), "--ks", "1,10,100,320", "--out", str(out)]) == 0
    res = json.loads((out / "coverage.json").read_text())
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(path))
    V = 320
    all_hits, all_tokens = [], []
    for s in res["samples"]:
        text = tok.apply_chat_template([{"role": "user", "content": f"tell me about the {s['category']}"}],
                                       add_generation_prompt=True, tokenize=False)
        prompt = tok(text, add_special_tokens=False)["input_ids"]
        gen = [agree_next_token(prompt[-1] + j, V) for j in range(9)]
        assert s["prompt_tokens"] == len(prompt) and s["new_tokens"] == 9  # eos (id 1) is not reached here
        # Token gen[j] (j >= 1) is in the stream iff it appears in the prompt or some earlier top-k row
        # holds it; recompute the top-k with the model's own logits as the independent reference.
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
        logits = model(torch.tensor([prompt + gen[:-1]])).logits[0]
        assert logits.argmax(-1)[len(prompt) - 1 :].tolist() == gen
        k = NanoSpecConfig().k_pre
        seen = set(prompt) | set(logits[: len(prompt)].topk(k, dim=-1).indices.reshape(-1).tolist())
        hits = []
        for j in range(9):
            if j > 0:
                hits.append(gen[j] in seen)
            seen |= {gen[j], *logits[len(prompt) - 1 + j].topk(k).indices.tolist()}
        assert s["nanospec_coverage"] == pytest.approx(sum(hits) / 8)
        all_hits += hits
        all_tokens += gen[1:]
    overall = res["categories"]["overall"]
    assert overall["tokens"] == len(all_tokens) == 24 and res["categories"]["alpha"]["questions"] == 2
    assert overall["nanospec_coverage"] == pytest.approx(sum(all_hits) / 24)
    texts = [c["conversations"][1]["value"] for c in json.loads(gzip.open(corpus, "rt").read())]
    rank = cov.frequency_rank(cov.token_counts(tok, texts, V, tok.eos_token_id))
    for k in (1, 10, 100, 320):
        expect = np.mean([rank[t] < k for t in all_tokens])
        assert overall["static_coverage"][str(k)] == pytest.approx(expect)
    assert overall["static_coverage"]["320"] == 1.0
    md = (out / "coverage.md").read_text()
    assert "| overall | 3 | 24 |" in md and "No draft tree" in md
    pngs = {p.name for p in out.glob("*.png")}
    assert pngs == {"coverage_alpha.png", "coverage_beta.png", "coverage_overall.png"}


def test_second_turn_sees_the_first_answer_and_bad_inputs_are_named(tmp_path, tiny, monkeypatch, capsys):
    path, _, _ = tiny
    monkeypatch.chdir(tmp_path)  # from any directory: the defaults are packaged
    q, corpus = write_inputs(tmp_path, ["alpha"])
    out = tmp_path / "out"
    assert cov.main(["--model", str(path), "--questions", str(q), "--turns", "2", "--max-new-tokens", "3",
                     "--out", str(out)]) == 0
    res = json.loads((out / "coverage.json").read_text())
    assert [s["question_id"] for s in res["samples"]] == [0, 0] and res["static_ks"] is None
    assert res["samples"][1]["prompt_tokens"] > res["samples"][0]["prompt_tokens"] + 3
    with pytest.raises(ValueError, match="fewer than --turns 3"):
        cov.main(["--model", str(path), "--questions", str(q), "--turns", "3", "--out", str(out)])
    with pytest.raises(FileNotFoundError, match="question file not found"):
        cov.main(["--model", str(path), "--questions", str(tmp_path / "nope.jsonl"), "--out", str(out)])
    with pytest.raises(FileNotFoundError, match="corpus file not found"):
        cov.main(["--model", str(path), "--questions", str(q), "--corpus", str(tmp_path / "x.gz"),
                  "--out", str(out)])
    with pytest.raises(SystemExit):
        cov.main(["--model", str(path), "--questions", str(q), "--ks", "1,two", "--out", str(out)])
    assert "--ks must be comma-separated integers" in capsys.readouterr().err
    # No --questions: the MT-bench questions shipped in nanospec/data (first one: writing); no --corpus: the
    # static comparison is skipped.
    assert cov.main(["--model", str(path), "--num-questions", "1", "--max-new-tokens", "2", "--out",
                     str(out)]) == 0
    res = json.loads((out / "coverage.json").read_text())
    assert [s["category"] for s in res["samples"]] == ["writing"] and res["static_ks"] is None


def test_load_questions_limits_per_category(tmp_path):
    # The analysis reads questions with the benchmarks' one reader (nanospec.data.load_questions).
    q, _ = write_inputs(tmp_path, ["a", "a", "b", "a", "b", "c"])
    assert [r["question_id"] for r in cov.load_questions(q, per_category=2)] == [0, 1, 2, 4, 5]
    assert [r["question_id"] for r in cov.load_questions(q, 3, per_category=1)] == [0, 2, 5]
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"question_id": 1, "turns": []}) + "\n")
    with pytest.raises(ValueError, match="bad.jsonl:1: expected an object with a non-empty string list"):
        cov.load_questions(bad)
    with pytest.raises(FileNotFoundError, match="question file not found"):
        cov.load_questions(tmp_path / "none.jsonl")


def test_sweep_replays_the_same_generations_with_more_candidates(tmp_path, tiny, monkeypatch):
    path, _, _ = tiny
    monkeypatch.chdir(tmp_path)
    q, _ = write_inputs(tmp_path, ["alpha", "beta"])
    out = tmp_path / "out"
    assert cov.main(["--model", str(path), "--questions", str(q), "--max-new-tokens", "12",
                     "--sweep-k", "1,3,8", "--out", str(out)]) == 0
    res = json.loads((out / "coverage.json").read_text())
    for r in res["categories"].values():
        by_k = {s["k"]: s for s in r["sweep"]}
        assert by_k[3]["nanospec_coverage"] == r["nanospec_coverage"]  # defaults are k_pre = k_ver = 3
        assert by_k[3]["nanospec_mean_vocab"] == r["nanospec_mean_vocab"]
        # No eviction here (short streams), so more candidates can only add tokens to the vocabulary.
        cover = [by_k[k]["nanospec_coverage"] for k in (1, 3, 8)]
        size = [by_k[k]["nanospec_mean_vocab"] for k in (1, 3, 8)]
        assert cover == sorted(cover) and size[0] < size[1] < size[2]
    assert "Sensitivity" in (out / "coverage.md").read_text()
    with pytest.raises(ValueError, match="k_pre must be a positive integer"):
        cov.main(["--model", str(path), "--questions", str(q), "--sweep-k", "0", "--out", str(out)])
