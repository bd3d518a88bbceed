"""The Spec-Bench harness's logic without servers: questions, multi-turn prompts, metrics, outputs, the
draft step timing, the static top-N head chosen from the prompts and --make-tiny."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from nanospec.bench import specbench as sb
from nanospec.data import load_questions
from tests.support.tiny_models import make_tiny_eagle3_draft, make_tiny_llama, make_tokenizer

QUESTIONS = [
    {"question_id": 1, "category": "writing", "turns": ["Write a poem.", "Make it shorter."]},
    {"question_id": 2, "category": "writing", "turns": ["Write a story."]},
    {"question_id": 3, "category": "math", "turns": ["What is 2 + 2?", "And 3 + 3?"]},
    {"question_id": 4, "category": "coding", "turns": ["Explain a hash table."]},
]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return make_tokenizer(tmp_path_factory.mktemp("tok"), vocab_size=512)


@pytest.fixture
def qfile(tmp_path):
    p = tmp_path / "question.jsonl"
    p.write_text("\n".join(json.dumps(q) for q in QUESTIONS) + "\n\n")
    return p


def test_questions_are_bounded_per_category_and_in_total(qfile):
    assert [q["question_id"] for q in load_questions(qfile)] == [1, 2, 3, 4]
    assert [q["question_id"] for q in load_questions(qfile, per_category=1)] == [1, 3, 4]
    assert [q["question_id"] for q in load_questions(qfile, num_questions=2, per_category=1)] == [1, 3]
    assert [q["question_id"] for q in load_questions(qfile, categories=["math", "coding"])] == [3, 4]


@pytest.mark.parametrize("line, message", [("not json", "not JSON"), ('{"turns": []}', "turns"),
                                           ('{"turns": [1]}', "turns"), ('{"prompt": "x"}', "turns")])
def test_malformed_question_lines_are_clear_errors(tmp_path, line, message):
    p = tmp_path / "q.jsonl"
    p.write_text(line + "\n")
    with pytest.raises(ValueError, match=message):
        load_questions(p)
    with pytest.raises(SystemExit, match=message):  # the harness stops with the same message
        sb.run(sb.parse_args(["--target", "m", "--draft", "d", "--questions", str(p)]))


def test_missing_question_file_is_an_error_and_the_default_is_the_packaged_one(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert sb.find_questions(None).name == "mt_bench.jsonl"  # nanospec/data's copy
    with pytest.raises(SystemExit, match="not found"):
        sb.find_questions(str(tmp_path / "nope.jsonl"))


def test_second_turn_prompt_holds_first_question_and_answer(tokenizer):
    turns = ["Write a poem.", "Make it shorter."]
    first = sb.render(tokenizer, turns, [])
    second = sb.render(tokenizer, turns, ["Roses are red."])
    expected = tokenizer.apply_chat_template(
        [{"role": "user", "content": turns[0]}, {"role": "assistant", "content": "Roses are red."},
         {"role": "user", "content": turns[1]}], add_generation_prompt=True, tokenize=False)
    assert tokenizer.decode(second) == expected
    assert second[: len(first) - 1] == first[:-1]  # the first turn's prompt is a prefix (up to the cue)
    assert "Make it shorter." not in tokenizer.decode(first)


def test_each_method_answers_turn_two_after_its_own_turn_one(tokenizer):
    seen = []

    def generate(ids):
        seen.append(tokenizer.decode(ids))
        n = len(seen)
        return {"text": f"answer{n}", "output_ids": [n, n], "meta_info": {
            "completion_tokens": 2, "spec_verify_ct": 1, "nanospec_mean_active_vocab": 100.0 * n}}

    records = sb.answer_all(generate, tokenizer, QUESTIONS[:2], max_new_tokens=8, max_turns=2)
    assert [(r["question_id"], r["turn"]) for r in records] == [(1, 1), (1, 2), (2, 1)]
    assert "answer1" in seen[1] and "answer1" not in seen[2]
    assert records[1]["prompt_tokens"] > records[0]["prompt_tokens"]
    assert records[2]["active_vocab"] == 300.0 and records[0]["verify_ct"] == 1
    assert len(sb.answer_all(generate, tokenizer, QUESTIONS[:1], 8, max_turns=1)) == 1


def fake_servers(monkeypatch) -> list[tuple]:
    """Replace the harness's Server; returns the list of what the fake servers were asked, in order."""
    events: list[tuple] = []

    class FakeServer:
        def __init__(self, model, args, env, log):
            self.name = log.stem
            events.append(("args", self.name, list(args)))
            log.parent.mkdir(parents=True, exist_ok=True)
            log.write_text("")

        def start(self):
            events.append(("start", self.name))
            return self

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            events.append(("stop", self.name))

        def generate(self, ids, max_new_tokens=32, ignore_eos=False):
            events.append(("generate", self.name, max_new_tokens))
            return {"text": self.name, "output_ids": [1], "meta_info": {"completion_tokens": 1}}

    monkeypatch.setattr(sb, "Server", FakeServer)
    return events


def test_interleaved_run_starts_every_server_first_then_rotates_the_methods_question_by_question(
        tokenizer, tmp_path, monkeypatch):
    events = fake_servers(monkeypatch)
    methods = [sb.Method("ar"), sb.Method("eagle3", ["--speculative-algorithm", "EAGLE3"]),
               sb.Method("nanospec")]
    runs = sb.run_interleaved(methods, "target", ["--device", "cpu"], {}, tokenizer, QUESTIONS[:3], 16, 1,
                              tmp_path / "logs")
    events = [e for e in events if e[0] != "args"]
    warm = [("start", "ar"), ("generate", "ar", 8), ("start", "eagle3"), ("generate", "eagle3", 8),
            ("start", "nanospec"), ("generate", "nanospec", 8)]
    assert events[:6] == warm  # every server up (and warmed up) before the first measured request
    asked = [e[1] for e in events[6:] if e[0] == "generate"]
    assert asked == ["ar", "eagle3", "nanospec", "eagle3", "nanospec", "ar", "nanospec", "ar", "eagle3"]
    assert sorted(e[1] for e in events if e[0] == "stop") == ["ar", "eagle3", "nanospec"]
    assert [r["method"] for r in runs] == ["ar", "eagle3", "nanospec"]
    assert all([x["question_id"] for x in r["records"]] == [1, 2, 3] for r in runs)
    assert runs[1]["config"].startswith("steps None")  # read from its log, as a sequential run does


def test_interleaved_servers_sleep_when_idle(tokenizer, tmp_path, monkeypatch):
    events = fake_servers(monkeypatch)
    sb.run_interleaved([sb.Method("ar"), sb.Method("nanospec")], "t", ["--device", "cpu"], {}, tokenizer,
                       QUESTIONS[:1], 4, 1, tmp_path)
    args = [e[2] for e in events if e[0] == "args"]
    assert len(args) == 2 and all(a.count("--sleep-on-idle") == 1 for a in args)  # idle schedulers spin


def test_interleave_flag_reaches_the_harness():
    assert sb.parse_args(["--make-tiny", "d", "--interleave"]).interleave
    assert not sb.parse_args(["--make-tiny", "d"]).interleave


def rec(qid, cat, turn, tokens, wall, ids, verify=None, vocab=None):
    return {"question_id": qid, "category": cat, "turn": turn, "completion_tokens": tokens, "wall_s": wall,
            "output_ids": ids, "verify_ct": verify, "active_vocab": vocab}


RUNS = [
    {"method": "ar", "records": [rec(1, "a", 1, 10, 2.0, [1, 2]), rec(2, "b", 1, 20, 2.0, [3])]},
    {"method": "nanospec", "records": [rec(1, "a", 1, 10, 1.0, [1, 2], 4, 200.0),
                                       rec(2, "b", 1, 20, 1.0, [3], 5, 400.0)]},
    {"method": "eagle3", "records": [rec(1, "a", 1, 10, 4.0, [1, 2], 5), rec(2, "b", 1, 20, 1.0, [4], 10)]},
]


def test_summary_pools_tokens_time_and_verify_steps():
    s = sb.summarize(RUNS)
    assert s["ar"]["overall"]["tok_s"] == pytest.approx(30 / 4)
    assert s["ar"]["overall"]["accept"] is None and s["ar"]["overall"]["speedup"] == pytest.approx(1.0)
    ns = s["nanospec"]
    assert ns["overall"]["tok_s"] == pytest.approx(15.0) and ns["overall"]["speedup"] == pytest.approx(2.0)
    assert ns["overall"]["accept"] == pytest.approx(30 / 9)  # tokens over verify steps, not a mean of ratios
    assert ns["a"]["accept"] == pytest.approx(2.5) and ns["b"]["speedup"] == pytest.approx(2.0)
    assert ns["overall"]["active_vocab"] == pytest.approx(300.0) and ns["overall"]["equal_ar"] is True
    e3 = s["eagle3"]
    assert e3["a"]["equal_ar"] is True and e3["b"]["equal_ar"] is False
    assert e3["overall"]["equal_ar"] is False and e3["overall"]["mismatches"] == 1
    assert e3["a"]["speedup"] == pytest.approx(0.5) and e3["overall"]["active_vocab"] is None


def test_summary_without_ar_has_no_speedup_or_equality():
    s = sb.summarize(RUNS[1:])
    assert "speedup" not in s["nanospec"]["overall"]
    assert s["nanospec"]["overall"]["equal_ar"] is None


def test_results_are_written_as_json_markdown_and_png(tmp_path):
    s = sb.summarize(RUNS)
    paths = sb.write_results(s, RUNS, {"target": "/m/tiny", "questions": "2 questions"}, tmp_path / "o")
    data = json.loads(paths[0].read_text())
    assert data["summary"]["nanospec"]["overall"]["speedup"] == pytest.approx(2.0)
    assert data["runs"][0]["method"] == "ar" and data["meta"]["target"] == "/m/tiny"
    md = paths[1].read_text().splitlines()
    assert md[0].startswith("| category | method |") and len(md) == 2 + 3 * 3
    assert md[0].endswith("| = AR | draft step ms | draft step speed-up vs EAGLE3 | configuration |")
    assert "| **overall** | nanospec | 2 | 30 | 15.00 | 2.00x | 3.33 | 300 | yes | - | - |  |" in md
    assert "| b | eagle3 | 1 | 20 | 20.00 | 2.00x | 2.00 | - | no (1) | - | - |  |" in md
    png = paths[2].read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) < 200_000


def test_methods_map_to_algorithms_drafts_and_plugin_settings(tmp_path):
    spec = ["--speculative-num-steps", "3"]
    ms = {m.name: m for m in sb.make_methods(list(sb.ALL_METHODS), tmp_path / "d", tmp_path / "s", spec)}
    timed = {"NANOSPEC_TIME_DRAFT": "1"}  # every speculative server times its draft step; AR has none
    assert ms["ar"].args == [] and ms["ar"].env == {}
    assert ms["ar-repeat"].args == [] and ms["ar-repeat"].env == {}  # the noise floor: plain decoding again
    assert ms["eagle3"].args[:4] == ["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path",
                                     str(tmp_path / "d")]
    assert ms["eagle3"].env == timed and ms["eagle3-static"].env == timed
    assert ms["eagle3-static"].args[3] == str(tmp_path / "s") and ms["eagle3-static"].args[-2:] == spec
    assert ms["nanospec"].args[1] == "NANOSPEC" and ms["nanospec"].env == timed
    # NANOSPEC over the static head: the dynamic vocabulary intersected with the static rows
    assert ms["nanospec-static"].args[1] == "NANOSPEC"
    assert ms["nanospec-static"].args[3] == str(tmp_path / "s")
    assert ms["nanospec-context"].env == {**timed, "NANOSPEC_SOURCES": "context"}
    assert ms["nanospec-extension"].env == {**timed, "NANOSPEC_SOURCES": "extension"}
    assert ms["nanospec-indexed"].env == {**timed, "NANOSPEC_GATHER": "indexed"}
    # NANOSPEC runs its step controller unless pinned; EAGLE3 adaptive is SGLang's own rule
    assert ms["nanospec-fixed"].env == {**timed, "NANOSPEC_STEPS": "fixed"}
    adaptive = ms["eagle3-adaptive"].args
    assert adaptive[1] == "EAGLE3" and adaptive[-1] == "--speculative-adaptive"


def test_the_table_says_what_each_method_ran():
    spec = ["--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
            "--speculative-num-draft-tokens", "4"]
    names = ["ar", "eagle3", "eagle3-adaptive", "nanospec"]
    ms = {m.name: m for m in sb.make_methods(names, None, None, spec)}
    report = {"buckets": {"1": {"ran": {"0": 1, "1": 3}}}}
    log = ("x\nNANOSPEC steps report: " + json.dumps({"buckets": {}}) + "\n"
           "NANOSPEC steps report: " + json.dumps(report) + "\n")
    assert sb.steps_report_from_log(log) == report and sb.steps_report_from_log("nothing") is None
    assert sb.method_config(ms["ar"], "", None) == "plain decoding"
    assert sb.method_config(ms["eagle3"], "", None) == "steps 3, topk 1, 4 draft tokens"
    assert sb.method_config(ms["nanospec"], log, report) == "controller: k=0 25%, k=1 75%"
    moved = "Adaptive spec params updated: steps 3 -> 1 (ema)\nAdaptive spec params updated: steps 1 -> 3\n"
    assert sb.method_config(ms["eagle3-adaptive"], moved, None) == "SGLang adaptive (steps [1, 3])"


def test_a_repeat_of_plain_decoding_needs_no_draft():
    a = sb.parse_args(["--target", "m", "--methods", "ar,ar-repeat"])
    assert a.methods == ["ar", "ar-repeat"] and a.draft is None


def test_bad_command_lines_are_rejected(capsys):
    with pytest.raises(SystemExit):
        sb.parse_args(["--target", "m", "--methods", "ar,medusa"])
    assert "unknown method" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        sb.parse_args(["--target", "m", "--methods", "ar,nanospec"])
    assert "--draft" in capsys.readouterr().err
    assert sb.parse_args(["--target", "m", "--methods", "ar"]).methods == ["ar"]


def test_cpu_servers_run_float32_with_the_cpu_attention_backend():
    args = sb.base_server_args("cpu", "float32", "--foo 1")
    assert args[:4] == ["--device", "cpu", "--dtype", "float32"]
    assert "intel_amx" in args and args[-2:] == ["--foo", "1"]
    assert "intel_amx" not in sb.base_server_args("cuda", "auto", "")


# -- draft step time ------------------------------------------------------------------------------------

def test_draft_step_time_is_the_last_timing_line_of_the_server_log():
    log = ("[2026-11-30 05:00:00] Load weight end.\n"
           "[05:00:01 TP0] NANOSPEC timing: draft step 128.700 ms median, 140.100 ms mean over 10 calls\n"
           "[2026-11-30 05:00:02 TP0] Decode batch. #running-req: 1\n"
           "[05:00:03 TP0] NANOSPEC timing: draft step 96.310 ms median, 110.520 ms mean over 20 calls\n"
           "[2026-11-30 05:00:04] INFO: 127.0.0.1 - POST /generate 200 OK\n")
    assert sb.draft_ms_from_log(log) == pytest.approx(96.31)
    assert sb.draft_ms_from_log("Load weight end.\nDecode batch.\n") is None
    assert sb.draft_ms_from_log("") is None


TIMED_RUNS = [{**RUNS[0], "draft_ms": None}, {**RUNS[1], "draft_ms": 40.0}, {**RUNS[2], "draft_ms": 120.0},
              {"method": "eagle3-static", "draft_ms": None, "records": RUNS[2]["records"]}]


def test_draft_step_speedup_is_eagle3_draft_time_over_each_methods():
    s = sb.summarize(TIMED_RUNS)
    assert s["nanospec"]["overall"]["draft_ms"] == 40.0
    assert s["nanospec"]["overall"]["draft_speedup"] == pytest.approx(3.0)
    assert s["eagle3"]["overall"]["draft_speedup"] == pytest.approx(1.0)
    # AR has no draft step; a method whose log had no timing line gets no ratio either.
    assert s["ar"]["overall"]["draft_ms"] is None and s["ar"]["overall"]["draft_speedup"] is None
    assert s["eagle3-static"]["overall"]["draft_speedup"] is None
    assert "draft_ms" not in s["nanospec"]["a"]  # one server run per method: overall only
    md = sb.markdown(s).splitlines()
    assert "| **overall** | nanospec | 2 | 30 | 15.00 | 2.00x | 3.33 | 300 | yes | 40.00 | 3.00x |  |" in md
    assert "| **overall** | ar | 2 | 30 | 7.50 | 1.00x | - | - | yes | - | - |  |" in md
    assert "| a | nanospec | 1 | 10 | 10.00 | 2.00x | 2.50 | 200 | yes | - | - |  |" in md


def test_without_an_eagle3_run_there_is_no_draft_speedup():
    s = sb.summarize([TIMED_RUNS[0], TIMED_RUNS[1]])
    assert s["nanospec"]["overall"]["draft_ms"] == 40.0 and "draft_speedup" not in s["nanospec"]["overall"]
    assert "| **overall** | nanospec | 2 | 30 | 15.00 | 2.00x | 3.33 | 300 | yes | 40.00 | - |  |" in (
        sb.markdown(s).splitlines())


def test_json_keeps_each_methods_draft_step_time(tmp_path):
    s = sb.summarize(TIMED_RUNS)
    paths = sb.write_results(s, TIMED_RUNS, {"target": "/m/tiny", "questions": "2 questions"}, tmp_path)
    data = json.loads(paths[0].read_text())
    assert data["summary"]["nanospec"]["overall"]["draft_speedup"] == pytest.approx(3.0)
    assert [r["draft_ms"] for r in data["runs"]] == [None, 40.0, 120.0, None]


# -- static top-N head chosen from the prompts ----------------------------------------------------------

@pytest.fixture(scope="module")
def tiny_pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("pair")
    target = make_tiny_llama(root / "run" / "target", vocab_size=512)
    return target, make_tiny_eagle3_draft(root / "run" / "final", target)


def test_prompt_static_draft_keeps_the_prompts_most_frequent_tokens(tiny_pair, tmp_path):
    from transformers import AutoTokenizer

    target, draft = tiny_pair

    tok = AutoTokenizer.from_pretrained(target)
    counts = sb.prompt_token_counts(tok, QUESTIONS, max_turns=2, vocab_size=512)
    assert counts.shape == (512,) and int(counts.sum()) == sum(
        len(sb.render(tok, [t], [])) for q in QUESTIONS for t in q["turns"])
    out = sb.prompt_static_draft(draft, 64, tmp_path / "s", counts)
    w, full = load_file(str(out / "model.safetensors")), load_file(str(draft / "model.safetensors"))
    hot = w["d2t"] + torch.arange(64)  # d2t: kept id minus draft id, SGLang's format
    assert w["d2t"].shape == (64,) and w["lm_head.weight"].shape == (64, full["lm_head.weight"].shape[1])
    assert torch.equal(w["lm_head.weight"], full["lm_head.weight"][hot])
    assert w["t2d"].shape == (512,) and w["t2d"].sum() == 64 and bool(w["t2d"][hot].all())
    assert torch.equal(w["fc.weight"], full["fc.weight"])  # everything but the head is the draft's
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["draft_vocab_size"] == 64 and cfg["vocab_size"] == 512
    assert set(torch.nonzero(counts).flatten().tolist()) <= set(hot.tolist())  # every prompt token
    assert tok.eos_token_id in hot.tolist() and (out / "tokenizer.json").is_file()


def test_static_head_comes_from_the_prompts_when_the_draft_has_no_token_counts(tiny_pair, tmp_path):
    from transformers import AutoTokenizer

    target, draft = tiny_pair
    a = sb.parse_args(["--target", str(target), "--draft", str(draft), "--static-top-n", "100000"])
    path, how = sb.choose_static_draft(a, AutoTokenizer.from_pretrained(target), QUESTIONS, tmp_path)
    assert path == tmp_path / "draft_static_top512_prompts"  # N capped at V
    assert "own prompts" in how and "optimistic" in how
    assert json.loads((path / "config.json").read_text())["draft_vocab_size"] == 512


def test_static_head_uses_the_training_token_counts_when_the_run_has_them(tiny_pair, tmp_path, monkeypatch):
    target, draft = tiny_pair
    assert sb.find_token_counts(draft, None) is None
    counts = draft.parent / "token_counts.safetensors"
    counts.write_bytes(b"")  # only its presence matters here; nanospec.train.export reads it
    exported = []
    monkeypatch.setattr(sb, "static_draft", lambda d, n, out, c: exported.append((d, n, c)) or out)
    try:
        assert sb.find_token_counts(draft, None) == counts
        a = sb.parse_args(["--target", str(target), "--draft", str(draft), "--static-top-n", "64"])
        path, how = sb.choose_static_draft(a, None, QUESTIONS, tmp_path)
    finally:
        counts.unlink()
    assert exported == [(draft, 64, str(counts))] and path == tmp_path / "draft_static_top64"
    assert "training tokens" in how
    with pytest.raises(SystemExit, match="not found"):
        sb.find_token_counts(draft, str(tmp_path / "nope.safetensors"))


def test_a_draft_of_another_target_stops_the_run_before_any_server(tiny_pair, tmp_path, monkeypatch):
    _, draft = tiny_pair
    other = tmp_path / "other"
    other.mkdir()
    (other / "config.json").write_text(json.dumps({"vocab_size": 640, "hidden_size": 64}))
    monkeypatch.setattr(sb, "run_method", lambda *a, **k: pytest.fail("a server was started"))
    a = sb.parse_args(["--target", str(other), "--draft", str(draft), "--methods", "ar,eagle3"])
    with pytest.raises(SystemExit, match=r"--draft: .*final/config.json: .*512 tokens.*vocab_size 640"):
        sb.run(a)
    a = sb.parse_args(["--target", str(other), "--draft", str(tmp_path / "nope"), "--methods", "nanospec"])
    with pytest.raises(SystemExit, match="nope: no such directory"):
        sb.run(a)


# -- --make-tiny ----------------------------------------------------------------------------------------

def test_make_tiny_replaces_target_and_draft(tmp_path):
    a = sb.parse_args(["--make-tiny", str(tmp_path / "tiny")])
    assert a.make_tiny == tmp_path / "tiny" and (a.vocab, a.hidden) == (32768, 512)
    assert a.target is None and a.draft is None and "nanospec" in a.methods  # no --draft needed
    a = sb.parse_args(["--make-tiny", "d", "--vocab", "1000", "--hidden", "64", "--methods", "eagle3"])
    assert (a.vocab, a.hidden, a.methods) == (1000, 64, ["eagle3"])


@pytest.mark.parametrize("argv, message", [
    (["--make-tiny", "d", "--target", "m"], "leave out --target"),
    (["--make-tiny", "d", "--draft", "x"], "leave out --target"),
    (["--make-tiny", "d", "--vocab", "100"], "--vocab"),
    (["--make-tiny", "d", "--hidden", "100"], "--hidden"),
    ([], "--make-tiny DIR"),
])
def test_bad_make_tiny_command_lines_are_rejected(argv, message, capsys):
    with pytest.raises(SystemExit):
        sb.parse_args(argv)
    assert message in capsys.readouterr().err


def test_make_tiny_models_are_built_once_and_reused(tmp_path):
    from nanospec.testing import make_tiny

    target, draft = make_tiny(tmp_path, 512, 64)
    assert json.loads((target / "config.json").read_text())["num_attention_heads"] == 8
    assert json.loads((draft / "config.json").read_text())["draft_vocab_size"] == 512
    stamp = (draft / "model.safetensors").stat().st_mtime_ns
    assert make_tiny(tmp_path, 512, 64) == (target, draft)
    assert (draft / "model.safetensors").stat().st_mtime_ns == stamp


def test_make_tiny_run_benchmarks_the_tiny_pair_and_says_how_the_static_head_was_chosen(
        tmp_path, qfile, monkeypatch, capsys):
    calls = []

    def fake_run_method(method, target, base_args, env, tokenizer, questions, *rest):
        calls.append((method, target))
        ms = {"eagle3": 90.0, "eagle3-static": 60.0, "nanospec": 30.0}.get(method.name)
        records = [rec(q["question_id"], q["category"], 1, 8, 1.0, [1] * 8, None if ms is None else 4)
                   for q in questions]
        return {"method": method.name, "startup_s": 0.0, "draft_ms": ms, "records": records}

    monkeypatch.setattr(sb, "run_method", fake_run_method)
    monkeypatch.setattr(sb, "stop_on_sigterm", lambda: None)  # leave pytest's SIGTERM handling alone
    out = tmp_path / "out"
    assert sb.main(["--make-tiny", str(tmp_path / "tiny"), "--vocab", "512", "--hidden", "64",
                    "--questions", str(qfile), "--max-turns", "1", "--static-top-n", "64",
                    "--out", str(out)]) == 0
    target, draft = tmp_path / "tiny" / "target", tmp_path / "tiny" / "draft"
    assert [(m.name, t) for m, t in calls] == [(n, str(target)) for n in sb.DEFAULT_METHODS.split(",")]
    assert calls[1][0].args[3] == str(draft)
    assert calls[2][0].args[3] == str(out / "work" / "draft_static_top64_prompts")
    meta = json.loads((out / "specbench.json").read_text())["meta"]
    assert meta["make_tiny"] == {"dir": str(tmp_path / "tiny"), "vocab": 512, "hidden": 64}
    assert "own prompts" in meta["static_head"] and meta["draft"] == str(draft)
    printed = capsys.readouterr().out
    assert "static draft: static top-64 head chosen from the benchmark's own prompts" in printed
    assert "| **overall** | nanospec |" in printed and "| 30.00 | 3.00x |  |" in printed
    assert "draft step 30.00 ms" in printed

