"""nanospec.train.regenerate: the target's own greedy answers as pre-tokenized training records.

Units with a stand-in for SGLang's /generate, then the real thing: a CPU SGLang server over the agreeing
tiny target, whose greedy answer to any prompt is known (each token is the previous one + 1), and the
trainer reading the written file.
"""

import gzip
import json

import pytest

from nanospec.train import regenerate
from nanospec.train.data import load_samples
from tests.support.tiny_models import agree_next_token, make_tiny_llama, make_tokenizer

V = 512


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return make_tokenizer(tmp_path_factory.mktemp("tok"), vocab_size=V)


def conv(*turns):
    return {"conversations": [{"from": f, "value": v} for f, v in turns]}


def test_prompt_is_everything_before_the_first_reply():
    msgs = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"},
            {"role": "assistant", "content": "a"}, {"role": "user", "content": "u2"}]
    assert regenerate.prompt_messages(msgs) == msgs[:2]
    assert regenerate.prompt_messages([{"role": "system", "content": "s"},
                                       {"role": "assistant", "content": "a"}]) is None


def test_prompts_skip_bad_and_long_records_by_reason(tokenizer, tmp_path):
    data = tmp_path / "d.json.gz"
    recs = [conv(("human", "hello there"), ("gpt", "hi")), {"conversations": "x"},
            conv(("human", "word " * 400), ("gpt", "ok")), conv(("system", "be brief"), ("gpt", "hi")),
            conv(("human", "again"), ("gpt", "yes"))]
    data.write_bytes(gzip.compress(json.dumps(recs).encode()))
    out, skipped = regenerate.prompts(tokenizer, str(data), None, max_prompt=64)
    assert [i for i, _ in out] == [0, 4]
    assert out[0][1] == regenerate.prompt_ids(tokenizer, [{"role": "user", "content": "hello there"}])
    assert skipped == {"no conversation list": 1, "prompt longer than 64 tokens": 1,
                       "no user turn before the first reply": 1}
    out, _ = regenerate.prompts(tokenizer, str(data), 1, max_prompt=64)
    assert [i for i, _ in out] == [0]


def test_answers_keep_the_end_token_mask_the_prompt_and_fit_max_length():
    def post(path, payload):
        assert path == "/generate" and payload["input_ids"] == [[1, 2], [3]]
        assert [p["max_new_tokens"] for p in payload["sampling_params"]] == [6, 7]
        assert all(p["temperature"] == 0.0 for p in payload["sampling_params"])
        return [{"output_ids": [5, 6], "meta_info": {"finish_reason": {"type": "stop", "matched": 2}}},
                {"output_ids": [7] * 7, "meta_info": {"finish_reason": {"type": "length", "length": 7}}}]

    recs = regenerate.answer(post, [(10, [1, 2]), (11, [3])], max_length=8)
    assert recs == [{"input_ids": [1, 2, 5, 6, 2], "loss_mask": [0, 0, 1, 1, 1], "source": 10},
                    {"input_ids": [3] + [7] * 7, "loss_mask": [0] + [1] * 7, "source": 11}]


def test_rerun_skips_answered_records_and_drops_a_cut_last_line(tmp_path):
    out = tmp_path / "r.jsonl"
    assert regenerate.done_sources(out) == set()
    out.write_text('{"input_ids": [1], "loss_mask": [1], "source": 3}\n{"input_ids": [1], "loss_m')
    assert regenerate.done_sources(out) == {3}
    assert out.read_text() == '{"input_ids": [1], "loss_mask": [1], "source": 3}\n'
    out.write_text('{"source": 1}\nnot json\n{"source": 2}\n')
    with pytest.raises(ValueError, match="line 2"):
        regenerate.done_sources(out)


def test_regenerated_answers_are_the_targets_greedy_continuations_through_sglang(tmp_path):
    pytest.importorskip("sglang")
    target = make_tiny_llama(tmp_path / "target", vocab_size=V, agree=True)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(target)
    recs = [conv(("human", f"question number {i}"), ("gpt", "an answer")) for i in range(5)]
    data = tmp_path / "d.json"
    data.write_text(json.dumps(recs))
    out = tmp_path / "regen.jsonl"
    argv = ["--target-model-path", str(target), "--data-path", str(data), "--output", str(out),
            "--max-length", "48", "--min-answer", "8", "--concurrency", "2", "--max-records", "3"]
    assert regenerate.main(argv) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(r["source"] for r in rows) == [0, 1, 2]
    for r in rows:
        prompt = regenerate.prompt_ids(tok, [{"role": "user", "content": f"question number {r['source']}"}])
        n = len(prompt)
        answer = r["input_ids"][n:]
        assert r["input_ids"][:n] == prompt and r["loss_mask"] == [0] * n + [1] * len(answer)
        assert 0 < len(answer) <= 48 - n
        assert answer == [agree_next_token(prompt[-1] + j, V) for j in range(len(answer))]
    # A second call with more records answers only the new ones; the trainer reads the file as is.
    assert regenerate.main(argv[:-1] + ["5"]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(r["source"] for r in rows) == [0, 1, 2, 3, 4]
    samples, stats = load_samples(tok, str(out), max_length=48)
    assert len(samples) == 5 and not stats.skipped
