"""One short Spec-Bench run through real SGLang servers on tiny models: AR, EAGLE3 and NANOSPEC answer
two questions (two turns each), every speculative output equals AR's token for token, and each
speculative server reports its draft step time."""

from __future__ import annotations

import json

import pytest

from nanospec.bench import specbench as sb
from tests.support.tiny_models import make_tiny_eagle3_draft, make_tiny_llama


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    root = tmp_path_factory.mktemp("specbench")
    target = make_tiny_llama(root / "target", vocab_size=512)
    draft = make_tiny_eagle3_draft(root / "draft", target)
    questions = root / "question.jsonl"
    rows = [{"question_id": 7, "category": "writing", "turns": ["Write a short story.", "Shorter."]},
            {"question_id": 9, "category": "math", "turns": ["What is 2 + 2?", "Why?"]}]
    questions.write_text("".join(json.dumps(r) + "\n" for r in rows))
    args = sb.parse_args(["--target", str(target), "--draft", str(draft), "--questions", str(questions),
                          "--max-new-tokens", "8", "--ignore-eos", "--methods", "ar,eagle3,nanospec",
                          "--threads", "1", "--out", str(root / "out")])
    summary, runs, paths = sb.run(args)
    return summary, runs, paths


def test_speculative_outputs_equal_ar_on_every_turn(result):
    summary, runs, _ = result
    by = {r["method"]: r["records"] for r in runs}
    assert [(x["question_id"], x["turn"]) for x in by["ar"]] == [(7, 1), (7, 2), (9, 1), (9, 2)]
    for method in ("eagle3", "nanospec"):
        assert [x["output_ids"] for x in by[method]] == [x["output_ids"] for x in by["ar"]]
        assert summary[method]["overall"]["equal_ar"] is True
    assert all(len(x["output_ids"]) == 8 and x["completion_tokens"] == 8 for x in by["ar"])


def test_metrics_come_from_the_servers(result):
    summary, runs, _ = result
    for method in ("eagle3", "nanospec"):
        s = summary[method]["overall"]
        assert 1.0 <= s["accept"] <= 4.0 and s["tokens"] == 32 and s["tok_s"] > 0
    assert summary["ar"]["overall"]["accept"] is None
    # The tiny vocabulary is 512 tokens: the prompt and its top-3 alone make a sizeable part of it.
    assert 0 < summary["nanospec"]["overall"]["active_vocab"] <= 512
    assert summary["eagle3"]["overall"]["active_vocab"] is None
    assert set(summary["nanospec"]) == {"writing", "math", "overall"}
    # Draft step time from each speculative server's log (NANOSPEC_TIME_DRAFT=1); AR has no draft step.
    for method in ("eagle3", "nanospec"):
        assert summary[method]["overall"]["draft_ms"] > 0
        assert summary[method]["overall"]["draft_speedup"] > 0
    assert summary["ar"]["overall"]["draft_ms"] is None


def test_run_writes_json_table_and_chart(result):
    _, _, paths = result
    data = json.loads(paths[0].read_text())
    assert data["meta"]["methods"] == ["ar", "eagle3", "nanospec"] and len(data["runs"]) == 3
    assert "| **overall** | nanospec |" in paths[1].read_text()
    assert paths[2].read_bytes()[:4] == b"\x89PNG"
