"""The Spec-Bench harness's logic without servers: questions, multi-turn prompts, metrics, outputs."""

from __future__ import annotations

import json

import pytest

from nanospec.bench import specbench as sb
from tests.support.tiny_models import make_tokenizer

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
    assert [q["question_id"] for q in sb.load_questions(qfile)] == [1, 2, 3, 4]
    assert [q["question_id"] for q in sb.load_questions(qfile, per_category=1)] == [1, 3, 4]
    assert [q["question_id"] for q in sb.load_questions(qfile, num_questions=2, per_category=1)] == [1, 3]
    assert [q["question_id"] for q in sb.load_questions(qfile, categories=["math", "coding"])] == [3, 4]


@pytest.mark.parametrize("line, message", [("not json", "not JSON"), ('{"turns": []}', "turns"),
                                           ('{"turns": [1]}', "turns"), ('{"prompt": "x"}', "turns")])
def test_malformed_question_lines_are_clear_errors(tmp_path, line, message):
    p = tmp_path / "q.jsonl"
    p.write_text(line + "\n")
    with pytest.raises(SystemExit, match=message):
        sb.load_questions(p)


def test_missing_question_file_asks_for_questions(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit, match="--questions"):
        sb.find_questions(None)
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
    assert "| **overall** | nanospec | 2 | 30 | 15.00 | 2.00x | 3.33 | 300 | yes |" in md
    assert "| b | eagle3 | 1 | 20 | 20.00 | 2.00x | 2.00 | - | no (1) |" in md
    png = paths[2].read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) < 200_000


def test_methods_map_to_algorithms_drafts_and_plugin_settings(tmp_path):
    spec = ["--speculative-num-steps", "3"]
    ms = {m.name: m for m in sb.make_methods(list(sb.ALL_METHODS), tmp_path / "d", tmp_path / "s", spec)}
    assert ms["ar"].args == [] and ms["ar"].env == {}
    assert ms["eagle3"].args[:4] == ["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path",
                                     str(tmp_path / "d")]
    assert ms["eagle3-static"].args[3] == str(tmp_path / "s") and ms["eagle3-static"].args[-2:] == spec
    assert ms["nanospec"].args[1] == "NANOSPEC" and ms["nanospec"].env == {}
    assert ms["nanospec-context"].env == {"NANOSPEC_SOURCES": "context"}
    assert ms["nanospec-extension"].env == {"NANOSPEC_SOURCES": "extension"}
    assert ms["nanospec-indexed"].env == {"NANOSPEC_GATHER": "indexed"}


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
