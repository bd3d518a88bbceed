"""train/data.py: chat rendering with an assistant-only loss mask, ShareGPT parsing, truncated files."""

import gzip
import json
import logging

import pytest

from nanospec.train.data import (
    batch_indices,
    collate,
    load_samples,
    normalize,
    read_records,
    render,
    token_counts,
)
from tests.support.tiny_models import make_tokenizer


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return make_tokenizer(tmp_path_factory.mktemp("tok"))


def masked_runs(tok, ids, mask):
    """Decoded text of each maximal run of masked tokens."""
    runs, cur = [], []
    for t, m in zip(ids, mask, strict=True):
        if m:
            cur.append(t)
        elif cur:
            runs.append(cur)
            cur = []
    if cur:
        runs.append(cur)
    return [tok.decode(r) for r in runs]


CONVO = [
    {"role": "system", "content": "be brief"},
    {"role": "user", "content": "hello there"},
    {"role": "assistant", "content": "the quick fox"},
    {"role": "user", "content": "and then?"},
    {"role": "assistant", "content": "it jumps"},
]


def test_loss_mask_covers_exactly_the_assistant_replies_and_their_end_token(tok):
    ids, mask = render(tok, CONVO, max_length=1000)
    # Hand-checked against the tiny chat template.
    assert tok.decode(ids) == (
        "<|bos|><|system|>be brief\n<|user|>hello there\n<|assistant|>the quick fox<|eos|>\n"
        "<|user|>and then?\n<|assistant|>it jumps<|eos|>\n"
    )
    assert masked_runs(tok, ids, mask) == ["the quick fox<|eos|>", "it jumps<|eos|>"]
    unmasked = tok.decode([t for t, m in zip(ids, mask, strict=True) if not m])
    assert (
        unmasked
        == "<|bos|><|system|>be brief\n<|user|>hello there\n<|assistant|>\n<|user|>and then?\n<|assistant|>\n"
    )


def test_max_length_cuts_tokens_and_mask_together(tok):
    full_ids, full_mask = render(tok, CONVO, max_length=1000)
    ids, mask = render(tok, CONVO, max_length=12)
    assert ids == full_ids[:12] and mask == full_mask[:12]


def test_sharegpt_and_role_content_records_render_identically(tok):
    sharegpt = {"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "yo"}]}
    openai = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}
    assert (
        normalize(sharegpt)[0]
        == normalize(openai)[0]
        == [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    )


def test_malformed_records_are_skipped_and_counted(tok, tmp_path):
    good = {"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello there"}]}
    bad = [
        "just a string",
        {"id": 1},
        {"conversations": [{"from": "robot", "value": "x"}, {"from": "gpt", "value": "y"}]},
        {"conversations": [{"from": "human", "value": 3}, {"from": "gpt", "value": "y"}]},
        {"conversations": [{"from": "human", "value": "only a question"}]},
    ]
    path = tmp_path / "d.json"
    path.write_text(json.dumps([good, *bad, good]))
    samples, stats = load_samples(tok, str(path), max_length=256)
    assert len(samples) == 2 and stats.records == 7
    assert stats.skipped == {
        "not an object": 1,
        "no conversation list": 1,
        "unknown role": 1,
        "content is not a string": 1,
        "no assistant turn": 1,
    }
    assert "2 of 7 records kept" in stats.summary()


def test_truncated_json_file_yields_its_complete_records_and_a_warning(tok, tmp_path, caplog):
    recs = [
        {
            "id": i,
            "conversations": [{"from": "human", "value": f"q{i}"}, {"from": "gpt", "value": f"answer {i}"}],
        }
        for i in range(5)
    ]
    text = json.dumps(recs)
    cut = text.index('"id": 3') + 3  # inside the 4th record
    path = tmp_path / "cut.json.gz"
    with gzip.open(path, "wt") as f:
        f.write(text[:cut])
    with caplog.at_level(logging.WARNING):
        records, stats = read_records(str(path))
    assert [r["id"] for r in records] == [0, 1, 2]
    assert stats.truncated_file and "truncated" in caplog.text
    samples, _ = load_samples(tok, str(path), max_length=256)
    assert len(samples) == 3


def test_jsonl_with_a_cut_last_line_keeps_the_complete_lines(tmp_path, caplog):
    lines = [
        json.dumps({"conversations": [{"from": "human", "value": "a"}, {"from": "gpt", "value": "b"}]})
    ] * 3
    path = tmp_path / "d.jsonl"
    path.write_text("\n".join(lines) + "\n" + lines[0][:20])
    with caplog.at_level(logging.WARNING):
        records, stats = read_records(str(path))
    assert len(records) == 3 and stats.truncated_file


def test_holdout_splits_train_and_eval_without_overlap(tok, tmp_path):
    recs = [
        {"conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": f"reply number {i}"}]}
        for i in range(10)
    ]
    path = tmp_path / "d.json"
    path.write_text(json.dumps(recs))
    train, _ = load_samples(tok, str(path), 256, holdout=3, part="train")
    held, _ = load_samples(tok, str(path), 256, holdout=3, part="eval")
    assert len(train) == 7 and len(held) == 3
    assert not {tuple(s.input_ids) for s in train} & {tuple(s.input_ids) for s in held}


def test_batch_order_is_a_function_of_seed_and_step_and_covers_each_epoch():
    epoch = [i for step in range(5) for i in batch_indices(10, 2, step, seed=1)]
    assert sorted(epoch) == list(range(10))
    assert batch_indices(10, 2, 3, seed=1) == batch_indices(10, 2, 3, seed=1)
    assert [batch_indices(10, 2, s, seed=1) for s in range(5, 10)] != [
        batch_indices(10, 2, s, seed=1) for s in range(5)
    ]


def test_collate_pads_right_and_token_counts_see_only_assistant_tokens(tok):
    a = render(tok, CONVO, 1000)
    b = render(tok, CONVO[:3], 1000)
    from nanospec.train.data import Sample

    batch = collate([Sample(*a), Sample(*b)], pad_id=2)
    assert batch["input_ids"].shape == (2, len(a[0]))
    assert batch["attention_mask"][1].sum() == len(b[0]) and (batch["input_ids"][1, len(b[0]) :] == 2).all()
    counts = token_counts([Sample(*a)], len(tok))
    assert counts.sum() == sum(a[1]) and counts[tok.eos_token_id] == 2 and counts[tok.bos_token_id] == 0


def test_pretokenized_records_are_used_as_given_and_bad_ones_are_counted(tok, tmp_path):
    recs = [
        {"input_ids": [5, 6, 7, 8, 9], "loss_mask": [0, 0, 1, 1, 1]},
        {"input_ids": [5, 6, 7, 8]},
        {"input_ids": [5, 6, 99999]},
        {"input_ids": [5, 6, 7], "loss_mask": [1, 1]},
    ]
    path = tmp_path / "tok.json"
    path.write_text(json.dumps(recs))
    samples, stats = load_samples(tok, str(path), max_length=4)
    assert [(s.input_ids, s.loss_mask) for s in samples] == [
        ([5, 6, 7, 8], [0, 0, 1, 1]),
        ([5, 6, 7, 8], [1, 1, 1, 1]),
    ]
    assert stats.skipped == {
        "input_ids are not token ids of this tokenizer": 1,
        "loss_mask is not a 0/1 list as long as input_ids": 1,
    }


def test_datasets_sources_are_read_through_the_datasets_library(tmp_path):
    import datasets

    recs = [
        {"conversations": [{"from": "human", "value": f"q{i}"}, {"from": "gpt", "value": f"a{i}"}]}
        for i in range(3)
    ]
    datasets.Dataset.from_list(recs).save_to_disk(str(tmp_path / "saved"))
    datasets.Dataset.from_list(recs).to_parquet(str(tmp_path / "d.parquet"))
    for source in (tmp_path / "saved", tmp_path / "d.parquet"):
        records, stats = read_records(str(source))
        assert [normalize(r)[0] for r in records] == [normalize(r)[0] for r in recs] and stats.records == 3
