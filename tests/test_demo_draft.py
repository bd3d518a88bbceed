"""The demo's quick draft: bounded training through nanospec.train, cached by its settings, and its table."""

from __future__ import annotations

import json
import subprocess

import pytest

from nanospec import demo
from nanospec.bench import specbench
from nanospec.data import load_questions
from tests.support.tiny_models import make_tiny_llama


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return make_tiny_llama(tmp_path_factory.mktemp("target"), vocab_size=512)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    records = [{"conversations": [{"from": "human", "value": f"Count from {i}."},
                                  {"from": "gpt", "value": " ".join(str(i + k) for k in range(12))}]}
               for i in range(8)]
    path = tmp_path_factory.mktemp("data") / "chat.json"
    path.write_text(json.dumps(records))
    return path


def args_for(target, data, cache, *extra):
    return demo.parse_args(["--model", str(target), "--data", str(data), "--cache-dir", str(cache),
                            "--train-steps", "2", "--train-records", "8", *extra])


def test_cache_directory_changes_with_every_training_setting(target, data, tmp_path):
    base = demo.draft_settings(args_for(target, data, tmp_path), str(target))
    key = demo.draft_dir(tmp_path, base)
    assert demo.draft_dir(tmp_path, dict(base)) == key
    for field, value in (("max_steps", 3), ("max_minutes", 1.0), ("max_records", 9), ("lr", 1e-3),
                         ("data_bytes", 1), ("target_config", "other")):
        assert demo.draft_dir(tmp_path, {**base, field: value}) != key, field


def test_training_command_is_bounded_in_steps_time_and_length(target, data, tmp_path):
    s = demo.draft_settings(args_for(target, data, tmp_path, "--train-minutes", "2.5"), str(target))
    cmd = demo.train_command(str(target), str(data), tmp_path / "run", s)
    assert cmd[1:3] == ["-m", "nanospec.train"]  # the installed trainer, from any directory
    flags = dict(zip(cmd[3::2], cmd[4::2], strict=False))
    assert flags["--max-steps"] == "2" and flags["--max-minutes"] == "2.5" and flags["--max-length"] == "256"
    assert flags["--save-every"] == "0" and flags["--dtype"] == "float32"


def test_quick_draft_is_trained_once_then_reused(target, data, tmp_path, monkeypatch):
    a = args_for(target, data, tmp_path)
    final = demo.quick_draft(a, str(target))
    cfg = json.loads((final / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"] and cfg["draft_vocab_size"] == 512
    assert json.loads((final.parent / "demo_settings.json").read_text())["max_steps"] == 2

    def no_training(*args, **kwargs):
        raise AssertionError("a cached draft must not be trained again")

    monkeypatch.setattr(subprocess, "run", no_training)
    assert demo.quick_draft(a, str(target)) == final


def test_missing_data_or_questions_are_clear_errors(target, tmp_path):
    with pytest.raises(SystemExit, match="--data"):
        demo.quick_draft(args_for(target, tmp_path / "none.json", tmp_path), str(target))
    with pytest.raises(SystemExit, match="--questions"):
        demo.main(["--model", str(target), "--questions", str(tmp_path / "none.jsonl")])


def test_overall_table_lists_every_method_against_ar_with_what_it_ran():
    summary = {"ar": {"overall": {"tok_s": 10.0, "speedup": 1.0, "accept": None, "active_vocab": None,
                                  "equal_ar": True, "config": "plain decoding"}},
               "nanospec": {"overall": {"tok_s": 12.5, "speedup": 1.25, "accept": 1.8, "active_vocab": 812.4,
                                        "equal_ar": False, "config": "controller: k=0 10%, k=1 90%"}}}
    lines = demo.overall_table(summary).splitlines()
    assert lines[0].split() == ["method", "tok/s", "vs", "AR", "accepted/step", "active", "vocab", "=", "AR",
                                "configuration"]
    assert lines[1].split() == ["ar", "10.00", "1.00x", "-", "-", "yes", "plain", "decoding"]
    assert lines[2].split() == ["nanospec", "12.50", "1.25x", "1.80", "812", "no", "controller:", "k=0",
                                "10%,", "k=1", "90%"]


def test_category_spread_names_each_methods_slowest_and_fastest_category():
    def cats(**speedups):
        return {"overall": {"speedup": 1.0}, **{c: {"speedup": v} for c, v in speedups.items()}}

    summary = {"ar": cats(writing=1.0, math=1.0), "eagle3": cats(writing=0.7, math=0.9),
               "nanospec": cats(writing=0.98, math=1.29, coding=1.1)}
    assert demo.category_spread(summary).splitlines() == [
        "eagle3 vs ar by category: 0.70x (writing) to 0.90x (math)",
        "nanospec vs ar by category: 0.98x (writing) to 1.29x (math)"]
    assert demo.category_spread({"ar": cats(writing=1.0), "nanospec": cats(writing=1.1)}) == ""


def test_the_default_run_asks_each_category_one_question_of_128_tokens_side_by_side(target, data, tmp_path):
    a = demo.parse_args(["--model", str(target), "--data", str(data), "--out", str(tmp_path / "out")])
    a.questions = demo.question_file(a.questions)
    bench = specbench.parse_args(demo.bench_argv(a, str(target), tmp_path / "draft"))
    assert (bench.per_category, bench.num_questions, bench.max_new_tokens) == (1, None, 128)
    assert bench.interleave  # the methods side by side, not each on the host of its own minutes
    a.sequential = True
    assert not specbench.parse_args(demo.bench_argv(a, str(target), tmp_path / "draft")).interleave
    picked = load_questions(bench.questions, bench.num_questions, bench.per_category)
    assert len({q["category"] for q in picked}) == len(picked) == 8


def shipped(monkeypatch, tmp_path, target, name="tiny"):
    from tests.support.tiny_models import make_tiny_eagle3_draft

    root = tmp_path / "drafts"
    make_tiny_eagle3_draft(root / name, target)
    monkeypatch.setattr(demo, "SHIPPED_DRAFTS", root)
    return root / name


def test_draft_shipped_for_the_target_is_used_without_training(target, data, tmp_path, monkeypatch):
    path = shipped(monkeypatch, tmp_path, target)

    def no_training(*args, **kwargs):
        raise AssertionError("a shipped draft must not be trained")

    monkeypatch.setattr(subprocess, "run", no_training)
    a = demo.parse_args(["--model", "tiny", "--data", str(data), "--cache-dir", str(tmp_path / "c")])
    assert demo.pick_draft(a, str(target)) == path


def test_train_draft_flag_or_a_target_without_shipped_draft_trains_a_quick_one(target, data, tmp_path,
                                                                               monkeypatch):
    shipped(monkeypatch, tmp_path, target)
    a = args_for(target, data, tmp_path / "c")  # --model is the directory: nothing ships for it
    assert demo.pick_draft(a, str(target)).parent.parent == tmp_path / "c"
    a = demo.parse_args(["--model", "tiny", "--data", str(data), "--cache-dir", str(tmp_path / "c2"),
                         "--train-steps", "2", "--train-records", "8", "--train-draft"])
    assert demo.pick_draft(a, str(target)).parent.parent == tmp_path / "c2"


def test_truncated_missing_or_foreign_draft_is_refused_naming_the_file(target, data, tmp_path, monkeypatch):
    path = shipped(monkeypatch, tmp_path, target)
    other = make_tiny_llama(tmp_path / "other", vocab_size=384)
    a = demo.parse_args(["--model", "tiny", "--data", str(data)])
    with pytest.raises(SystemExit, match="config.json.*vocab"):
        demo.pick_draft(a, str(other))  # the tiny draft is for a 512-token target
    weights = path / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])
    with pytest.raises(SystemExit, match="model.safetensors.*truncated"):
        demo.pick_draft(a, str(target))
    weights.unlink()
    with pytest.raises(SystemExit, match="model.safetensors not found"):
        demo.pick_draft(a, str(target))


def test_draft_tree_settings_reach_the_harness(target, data, tmp_path):
    a = args_for(target, data, tmp_path, "--spec-steps", "4", "--spec-topk", "4", "--spec-draft-tokens", "8",
                 "--questions", str(data))
    bench = specbench.parse_args(demo.bench_argv(a, str(target), tmp_path / "draft"))
    assert (bench.spec_steps, bench.spec_topk, bench.spec_draft_tokens) == (4, 4, 8)
