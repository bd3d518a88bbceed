"""train/eagle3.py end to end on a tiny random Llama: run, resume, config, export, evaluation, learning,
and the CPU recipe (the target's top-K, the sampled softmax, held-out scores during training)."""

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoConfig

from nanospec.train import config as train_config
from nanospec.train import evaluate as train_evaluate
from nanospec.train import export as train_export
from nanospec.train.eagle3 import main as train_main
from nanospec.train.model import Eagle3Draft, candidate_set, draft_config
from tests.support.tiny_models import make_tiny_llama

ROOT = Path(__file__).resolve().parents[1]
WORDS = ["one", "two", "three", "four", "five", "six"]


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    # Tiny matmuls: a second thread only adds contention on a shared 2-core runner.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return make_tiny_llama(tmp_path_factory.mktemp("target"))  # 3 layers, vocab 512, random


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """Counting conversations: the reply continues a fixed cycle of words from where the user says."""
    rng = random.Random(0)
    records = []
    for _ in range(72):
        s = rng.randrange(len(WORDS))
        reply = " ".join(WORDS[(s + j) % len(WORDS)] for j in range(12))
        records.append(
            {
                "conversations": [
                    {"from": "human", "value": f"count from {WORDS[s]}"},
                    {"from": "gpt", "value": reply},
                ]
            }
        )
    path = tmp_path_factory.mktemp("data") / "count.json"
    path.write_text(json.dumps(records))
    return path


@pytest.fixture(scope="module")
def script_run(target, corpus, tmp_path_factory):
    """`python train/eagle3.py --config configs/train/tiny.yaml` with a flag overriding a YAML key."""
    out = tmp_path_factory.mktemp("run")
    cmd = [
        sys.executable,
        "train/eagle3.py",
        "--config",
        "configs/train/tiny.yaml",
        "--target-model-path",
        str(target),
        "--data-path",
        str(corpus),
        "--output-dir",
        str(out),
        "--ttt-steps",
        "2",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


def read_metrics(run):
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_script_run_logs_every_step_checkpoints_and_writes_a_full_vocabulary_draft(script_run):
    rows = read_metrics(script_run)
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert {"loss", "lr", "acc_1", "acc_2", "loss_1", "loss_2"} <= rows[0].keys() and "acc_3" not in rows[0]
    assert [p.name for p in sorted((script_run / "checkpoints").iterdir())] == ["step_2", "step_3"]
    assert list((script_run / "tensorboard").glob("events.out.tfevents.*"))
    cfg = json.loads((script_run / "final" / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"]
    assert cfg["draft_vocab_size"] == cfg["vocab_size"] == 512 and cfg["num_hidden_layers"] == 1
    # SGLang's default capture points for 3 layers, in the layer order SGLang concatenates them.
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [-1, 0, 1]
    assert cfg["tie_word_embeddings"] is False
    weights = load_file(str(script_run / "final" / "model.safetensors"))
    assert weights["lm_head.weight"].shape == (512, 64) and weights["fc.weight"].shape == (64, 3 * 64)
    assert (
        "midlayer.self_attn.q_proj.weight" in weights
        and weights["midlayer.self_attn.q_proj.weight"].shape[1] == 128
    )
    assert not {"d2t", "t2d", "embed_tokens.weight"} & weights.keys()


def test_resumed_run_ends_with_the_same_step_count_and_parameters_as_an_uninterrupted_one(
    target, corpus, tmp_path
):
    common = [
        "--target-model-path",
        str(target),
        "--data-path",
        str(corpus),
        "--max-steps",
        "6",
        "--ttt-steps",
        "2",
        "--batch-size",
        "2",
        "--lr",
        "1e-2",
        "--save-every",
        "0",
        "--max-length",
        "64",
    ]
    train_main([*common, "--output-dir", str(tmp_path / "a")])
    train_main([*common, "--output-dir", str(tmp_path / "b"), "--stop-at-step", "4"])
    assert not (tmp_path / "b" / "final").exists()
    assert [p.name for p in (tmp_path / "b" / "checkpoints").iterdir()] == ["step_4"]
    with pytest.raises(SystemExit, match="--resume"):  # never silently restart over a run's checkpoints
        train_main([*common, "--output-dir", str(tmp_path / "b")])
    train_main([*common, "--output-dir", str(tmp_path / "b"), "--resume"])
    a = load_file(str(tmp_path / "a" / "checkpoints" / "step_6" / "model.safetensors"))
    b = load_file(str(tmp_path / "b" / "checkpoints" / "step_6" / "model.safetensors"))
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name
    ra, rb = read_metrics(tmp_path / "a"), read_metrics(tmp_path / "b")
    assert [r["step"] for r in rb] == [1, 2, 3, 4, 5, 6]
    assert [r["loss"] for r in ra] == [r["loss"] for r in rb]  # same batches in the same order
    initial = load_file(str(tmp_path / "b" / "checkpoints" / "step_6" / "model.safetensors"))
    assert not torch.equal(initial["fc.weight"], torch.zeros_like(initial["fc.weight"]))


def test_flags_override_yaml_keys_and_bad_options_are_named(tmp_path):
    yaml_path = tmp_path / "c.yaml"
    yaml_path.write_text("lr: 0.5\nttt-steps: 4\naux_layer_ids: [0, 1, 2]\noutput_dir: /x\n")
    opts = train_config.load(
        ["--config", str(yaml_path), "--lr", "0.25", "--target-model-path", "m", "--data-path", "d"]
    )
    assert opts.lr == 0.25 and opts.ttt_steps == 4 and opts.aux_layer_ids == (0, 1, 2)
    assert opts.output_dir == "/x" and opts.warmup_steps == 20  # 2% of the default 1000 steps
    yaml_path.write_text("learning_rate: 0.1\n")
    with pytest.raises(ValueError, match="unknown option 'learning_rate'"):
        train_config.load(["--config", str(yaml_path)])
    with pytest.raises(ValueError, match="--data-path"):
        train_config.load(["--target-model-path", "m", "--output-dir", "o"])


@pytest.mark.parametrize(("ids", "named"), [
    ("-1,0,0", "layer id(s) [0] more than once"),  # SGLang captures layer 1 once: fc expects 3, gets 2
    ("0,1,2", "aux_layer_ids [2] out of range"),  # id 2 = output of the last of 3 layers: never captured
    ("1,0,-1", "not in increasing order"),  # SGLang concatenates in layer order: features swapped
    ("-2,0,1", "aux_layer_ids [-2] out of range"),
])
def test_aux_layer_ids_sglang_would_capture_differently_stop_the_run_at_start(target, tmp_path, capsys, ids,
                                                                              named):
    # No data file and no output directory exist: the run must stop before it reads or writes either.
    argv = ["--target-model-path", str(target), "--data-path", str(tmp_path / "missing.json"),
            "--output-dir", str(tmp_path / "run"), f"--aux-layer-ids={ids}"]
    with pytest.raises(SystemExit) as exc:
        train_main(argv)
    assert exc.value.code == 2
    assert named in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_aux_layer_ids_from_yaml_are_checked_when_options_are_loaded(tmp_path):
    yaml_path = tmp_path / "c.yaml"
    yaml_path.write_text("aux_layer_ids: [3, 3, 5]\n")
    with pytest.raises(ValueError, match=r"layer id\(s\) \[3\] more than once"):
        train_config.load(["--config", str(yaml_path), "--target-model-path", "m", "--data-path", "d",
                           "--output-dir", "o"])
    with pytest.raises(ValueError, match="comma-separated integers"):
        train_config.load(["--target-model-path", "m", "--data-path", "d", "--output-dir", "o",
                           "--aux-layer-ids", "1,x"])


def test_top_n_export_keeps_the_most_frequent_tokens_with_eos_in_sglangs_d2t_format(script_run, tmp_path):
    out = tmp_path / "top"
    train_export.main(
        [
            "--checkpoint",
            str(script_run / "checkpoints" / "step_3"),
            "--output",
            str(out),
            "--top-n",
            "20",
            "--dtype",
            "float32",
        ]
    )
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["draft_vocab_size"] == 20 and cfg["vocab_size"] == 512
    w = load_file(str(out / "model.safetensors"))
    ids = w["d2t"] + torch.arange(20)  # SGLang: hot_token_id = d2t + arange
    counts = load_file(str(script_run / "token_counts.safetensors"))["counts"]
    eos = cfg["eos_token_id"]
    assert eos in ids.tolist() and ids.tolist() == sorted(ids.tolist())
    others = [i for i in ids.tolist() if i != eos]
    rest = torch.ones(512, dtype=torch.bool)
    rest[ids] = False
    assert counts[others].min() >= counts[rest].max()  # nothing outside is more frequent than what is kept
    assert w["t2d"].sum() == 20 and w["t2d"][ids].all()
    full = load_file(str(script_run / "checkpoints" / "step_3" / "model.safetensors"))
    torch.testing.assert_close(w["lm_head.weight"], full["lm_head.weight"][ids])
    train_export.main(
        ["--checkpoint", str(script_run / "final"), "--output", str(tmp_path / "top2"), "--top-n", "20"]
    )
    assert torch.equal(
        load_file(str(tmp_path / "top2" / "model.safetensors"))["d2t"], w["d2t"]
    )  # same counts


def test_tied_head_draft_has_no_head_of_its_own_and_evaluates_with_the_targets(target, corpus, tmp_path):
    train_main(
        [
            "--target-model-path",
            str(target),
            "--data-path",
            str(corpus),
            "--output-dir",
            str(tmp_path),
            "--max-steps",
            "2",
            "--ttt-steps",
            "2",
            "--tie-head",
            "--max-length",
            "64",
            "--save-every",
            "0",
        ]
    )
    cfg = json.loads((tmp_path / "final" / "config.json").read_text())
    assert cfg["draft_vocab_size"] is None  # SGLang then binds the target's LM head
    assert "lm_head.weight" not in load_file(str(tmp_path / "final" / "model.safetensors"))
    res = train_evaluate.main(
        [
            "--draft",
            str(tmp_path / "final"),
            "--target-model-path",
            str(target),
            "--data-path",
            str(corpus),
            "--holdout",
            "4",
            "--steps",
            "2",
            "--max-length",
            "64",
        ]
    )
    assert res["positions"] > 0 and 0 <= res["acc_2"] <= 1


def test_training_learns_the_target_on_a_patterned_corpus(target, corpus, tmp_path):
    """A few hundred steps take TTT-step-1 agreement with the target from chance (1/512) to most tokens."""
    train_main(
        [
            "--target-model-path",
            str(target),
            "--data-path",
            str(corpus),
            "--output-dir",
            str(tmp_path),
            "--max-steps",
            "300",
            "--ttt-steps",
            "3",
            "--batch-size",
            "4",
            "--lr",
            "3e-3",
            "--head-init",
            "random",
            "--eval-holdout",
            "8",
            "--save-every",
            "0",
        ]
    )
    rows = read_metrics(tmp_path)
    assert rows[0]["acc_1"] < 0.05
    late = [r["acc_1"] for r in rows[-5:]]
    assert sum(late) / len(late) > 0.6, late
    res = train_evaluate.main(
        [
            "--draft",
            str(tmp_path / "final"),
            "--target-model-path",
            str(target),
            "--data-path",
            str(corpus),
            "--holdout",
            "8",
            "--steps",
            "3",
        ]
    )
    assert res["acc_1"] > 0.5, res  # held-out conversations
    assert res["chain_1"] == res["acc_1"] and res["chain_3"] <= res["chain_2"] <= res["chain_1"]
    assert res["accept_length_estimate"] > 1.5


def test_feature_cache_makes_a_second_run_skip_the_target_and_train_identically(
    target, corpus, tmp_path, monkeypatch
):
    import nanospec.train.target

    common = [
        "--target-model-path",
        str(target),
        "--data-path",
        str(corpus),
        "--max-steps",
        "3",
        "--ttt-steps",
        "2",
        "--batch-size",
        "2",
        "--save-every",
        "0",
        "--max-length",
        "64",
        "--hidden-cache-dir",
        str(tmp_path / "cache"),
    ]
    train_main([*common, "--output-dir", str(tmp_path / "a")])
    assert 0 < len(list((tmp_path / "cache").glob("*.safetensors"))) <= 6  # 3 steps x 2 (duplicates share)

    def no_target(*args, **kwargs):
        raise AssertionError("target forward ran although every feature is cached")

    monkeypatch.setattr(nanospec.train.target, "features", no_target)
    train_main([*common, "--output-dir", str(tmp_path / "b")])
    assert [r["loss"] for r in read_metrics(tmp_path / "a")] == [
        r["loss"] for r in read_metrics(tmp_path / "b")
    ]


@pytest.mark.parametrize("name", sorted(p.name for p in (ROOT / "configs" / "train").glob("*.yaml")))
def test_shipped_training_configs_use_only_known_options(name):
    opts = train_config.load(
        [
            "--config",
            str(ROOT / "configs" / "train" / name),
            "--target-model-path",
            "m",
            "--data-path",
            "d",
            "--output-dir",
            "o",
        ]
    )
    assert opts.ttt_steps >= 1 and opts.max_steps >= 1


@pytest.fixture(scope="module")
def tiny_draft(tmp_path_factory):
    """An untied draft for the tiny target (vocab 512) and random inputs for a 2 x 12 batch."""
    torch.manual_seed(0)
    cfg = draft_config(AutoConfig.from_pretrained(make_tiny_llama(tmp_path_factory.mktemp("t"))), None, False)
    draft = Eagle3Draft(cfg)
    b, t, h, v = 2, 12, cfg.hidden_size, cfg.vocab_size
    aux = torch.randn(b, t, 3 * h)
    embeds = torch.randn(b, t, h)
    probs = torch.randn(b, t, v).mul(3).softmax(-1)
    mask = torch.ones(b, t)
    mask[1, 9:] = 0
    return draft, aux, embeds, probs, mask


def run_loss(draft, aux, embeds, probs, mask, **kw):
    draft.zero_grad()
    out = draft(aux, embeds, probs, mask, 3, 0.8, **kw)
    out["loss"].backward()
    return out


def test_sampled_softmax_over_every_token_equals_the_full_softmax(tiny_draft):
    draft, aux, embeds, probs, mask = tiny_draft
    v = probs.shape[-1]
    top = probs.topk(v, dim=-1)  # K = V: the top-K target is the full distribution, sorted
    full = run_loss(draft, aux, embeds, probs, mask)
    topk = run_loss(draft, aux, embeds, top.values, mask, target_ids=top.indices)
    sampled = run_loss(draft, aux, embeds, top.values, mask, target_ids=top.indices,
                       candidates=torch.arange(v), full_every=3)
    for out in (topk, sampled):
        torch.testing.assert_close(out["loss"], full["loss"], rtol=1e-5, atol=1e-5)
        assert torch.equal(out["correct"], full["correct"]) and torch.equal(out["count"], full["count"])


def test_sampled_softmax_reaches_only_the_candidate_head_rows_except_on_full_rows(tiny_draft):
    draft, aux, embeds, probs, mask = tiny_draft
    top = probs.topk(4, dim=-1)
    tokens = torch.zeros(mask.shape, dtype=torch.long)
    cands = candidate_set(top.indices, tokens, mask, 8, probs.shape[-1], seed=0)
    run_loss(draft, aux, embeds, top.values, mask, target_ids=top.indices, candidates=cands, full_every=0)
    touched = draft.lm_head.weight.grad.abs().sum(-1) > 0
    outside = torch.ones_like(touched)
    outside[cands] = False
    assert touched[cands].any() and not touched[outside].any()
    run_loss(draft, aux, embeds, top.values, mask, target_ids=top.indices, candidates=cands, full_every=2)
    assert (draft.lm_head.weight.grad.abs().sum(-1) > 0)[outside].all()  # full rows push every row down


def test_candidate_set_is_every_top_k_id_the_batch_tokens_and_seeded_negatives_sorted():
    top = torch.tensor([[[7, 3], [3, 9], [60, 61]]])
    tokens = torch.tensor([[5, 7, 62]])
    valid = torch.tensor([[1, 1, 0]])  # padding: its ids must not decide the set
    a = candidate_set(top, tokens, valid, 4, 50, seed=1)
    assert torch.equal(a, torch.unique(a)) and {3, 5, 7, 9} <= set(a.tolist())
    assert not {60, 61, 62} & set(a.tolist()) and len(a) <= 4 + 4
    assert torch.equal(a, candidate_set(top, tokens, valid, 4, 50, seed=1))  # a resumed run draws the same


def test_sampled_softmax_without_the_targets_top_k_is_refused(tiny_draft):
    draft, aux, embeds, probs, mask = tiny_draft
    with pytest.raises(ValueError, match="top-K"):
        draft(aux, embeds, probs, mask, 2, candidates=torch.arange(8))


RECIPE = ["--tie-head", "--target-topk", "8", "--sampled-softmax", "16", "--full-vocab-every", "4"]


def test_recipe_run_scores_held_out_conversations_and_resumes_its_training_clock(target, corpus, tmp_path):
    common = ["--target-model-path", str(target), "--data-path", str(corpus), "--output-dir", str(tmp_path),
              "--max-steps", "4", "--ttt-steps", "2", "--batch-size", "2", "--max-length", "64",
              "--eval-holdout", "4", "--eval-every", "2", "--save-every", "0",
              "--hidden-cache-dir", str(tmp_path / "cache"), *RECIPE]
    train_main([*common, "--stop-at-step", "2"])
    assert not (tmp_path / "final").exists()
    train_main([*common, "--resume"])
    evals = [json.loads(x) for x in (tmp_path / "eval.jsonl").read_text().splitlines()]
    assert [e["step"] for e in evals] == [2, 4]
    assert all(e["positions"] > 0 and e["accept_length_estimate"] >= 1 for e in evals)
    seconds = [r["train_s"] for r in read_metrics(tmp_path)]
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2, 3, 4]
    assert seconds == sorted(seconds) and seconds[0] > 0  # the resumed run continues the clock
    assert (tmp_path / "final" / "model.safetensors").is_file()


def test_sampled_softmax_is_refused_without_top_k(target, corpus, tmp_path):
    with pytest.raises(SystemExit) as e:
        train_main(["--target-model-path", str(target), "--data-path", str(corpus), "--output-dir",
                    str(tmp_path), "--sampled-softmax", "16"])
    assert e.value.code == 2


def test_top_k_feature_cache_makes_a_second_run_skip_the_target_and_train_identically(
    target, corpus, tmp_path, monkeypatch
):
    import nanospec.train.target

    common = ["--target-model-path", str(target), "--data-path", str(corpus), "--max-steps", "3",
              "--ttt-steps", "2", "--batch-size", "2", "--save-every", "0", "--max-length", "64",
              "--hidden-cache-dir", str(tmp_path / "cache"), *RECIPE]
    train_main([*common, "--output-dir", str(tmp_path / "a")])
    stored = next((tmp_path / "cache").glob("*.safetensors"))
    assert set(load_file(str(stored))) == {"aux", "topk_ids", "topk_probs"}  # no final hidden state

    def no_target(*args, **kwargs):
        raise AssertionError("target forward ran although every feature is cached")

    monkeypatch.setattr(nanospec.train.target, "features", no_target)
    train_main([*common, "--output-dir", str(tmp_path / "b")])
    losses = [[r["loss"] for r in read_metrics(tmp_path / run)] for run in ("a", "b")]
    assert losses[0] == losses[1]


def test_recipe_learns_the_target_on_a_patterned_corpus(target, corpus, tmp_path):
    """The tied head, top-K target and sampled softmax still take held-out agreement far above chance."""
    train_main(["--target-model-path", str(target), "--data-path", str(corpus), "--output-dir", str(tmp_path),
                "--max-steps", "200", "--ttt-steps", "3", "--batch-size", "4", "--lr", "3e-3",
                "--eval-holdout", "8", "--save-every", "0", *RECIPE])
    res = train_evaluate.main(["--draft", str(tmp_path / "final"), "--target-model-path", str(target),
                               "--data-path", str(corpus), "--holdout", "8", "--steps", "3"])
    assert res["acc_1"] > 0.5, res


def test_options_are_one_frozen_dataclass_and_one_stop_reason_decides_checkpoint_and_export():
    import dataclasses

    from nanospec.train.eagle3 import stop_reason

    opts = train_config.load(["--target-model-path", "m", "--data-path", "d", "--output-dir", "o",
                              "--max-steps", "10", "--stop-at-step", "4", "--max-minutes", "1"])
    with pytest.raises(dataclasses.FrozenInstanceError):
        opts.lr = 1.0
    assert stop_reason(opts, 3, False) is None
    assert stop_reason(opts, 3, True) == "out_of_time"  # checkpoint and export
    assert stop_reason(opts, 4, True) == "interrupted"  # checkpoint, no export: the interruption wins
    assert stop_reason(opts, 10, True) == "done"  # the schedule's end always exports


def test_init_draft_starts_from_an_exported_draft_and_refuses_another_shape(target, corpus, tmp_path):
    base = ["--target-model-path", str(target), "--data-path", str(corpus), "--ttt-steps", "2",
            "--max-length", "64", "--save-every", "0", "--tie-head", "--dtype", "float32"]
    first = train_main(base + ["--output-dir", str(tmp_path / "a"), "--max-steps", "3"])
    # Zero steps from the export: the new run's final draft is the exported one, weight for weight.
    again = train_main(base + ["--output-dir", str(tmp_path / "b"), "--max-steps", "0",
                               "--init-draft", str(first)])
    w0, w1 = load_file(str(first / "model.safetensors")), load_file(str(again / "model.safetensors"))
    assert w0.keys() == w1.keys() and all(torch.equal(w0[k], w1[k]) for k in w0)
    fresh = train_main(base + ["--output-dir", str(tmp_path / "c"), "--max-steps", "0"])
    assert not torch.equal(load_file(str(fresh / "model.safetensors"))["fc.weight"], w0["fc.weight"])
    with pytest.raises(SystemExit, match="init-draft"):  # a tied draft into a run with its own head
        train_main([a for a in base if a != "--tie-head"] + ["--output-dir", str(tmp_path / "d"),
                                                            "--max-steps", "1", "--init-draft", str(first)])
    with pytest.raises(SystemExit, match="init-draft"):
        train_main(base + ["--output-dir", str(tmp_path / "e"), "--max-steps", "1",
                           "--init-draft", str(tmp_path / "missing")])
