"""docs/results.md's generated tables equal what nanospec.bench.report makes of the records in docs/results/;
a malformed record is an error naming its file."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from nanospec.bench import report

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results"
DOC = ROOT / "docs" / "results.md"


def test_results_md_tables_are_what_the_records_give() -> None:
    doc = DOC.read_text()
    assert report.render(doc, RESULTS) == doc, "run: python -m nanospec.bench.report"


def test_every_record_the_index_names_exists_and_every_block_cites_one() -> None:
    index = report.load_index(RESULTS)
    for name, entry in index.items():
        assert (RESULTS / entry["path"]).exists(), name
    cited = {r for _, records in report.BLOCKS.values() for r in records}
    assert cited == set(index), "records.json lists records no table cites (or the reverse)"


def test_check_mode_fails_when_a_table_was_edited_by_hand(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    shutil.copytree(RESULTS, tmp_path / "docs" / "results", ignore=shutil.ignore_patterns("*.png"))
    edited = DOC.read_text().replace("| NANOSPEC |", "| NANOSPEC* |", 1)
    assert edited != DOC.read_text()
    (tmp_path / "docs" / "results.md").write_text(edited)
    assert report.main(["--root", str(tmp_path), "--check"]) == 1
    (tmp_path / "docs" / "results.md").write_text(DOC.read_text())
    assert report.main(["--root", str(tmp_path), "--check"]) == 0


def _copy(tmp_path: Path) -> Path:
    out = tmp_path / "results"
    shutil.copytree(RESULTS, out, ignore=shutil.ignore_patterns("*.png"))
    return out


def test_a_specbench_record_without_its_summary_is_an_error_naming_the_file(tmp_path: Path) -> None:
    results = _copy(tmp_path)
    path = results / "mtbench_qwen" / "specbench.json"
    data = json.loads(path.read_text())
    del data["summary"]["nanospec"]
    path.write_text(json.dumps(data))
    expected = r"mtbench_qwen/specbench.json: missing \['summary'\]\['nanospec'"
    with pytest.raises(report.ReportError, match=expected):
        report.render(DOC.read_text(), results)


def test_a_truncated_record_is_an_error_naming_the_file(tmp_path: Path) -> None:
    results = _copy(tmp_path)
    path = results / "cpu_costs" / "verify_all.json"
    path.write_text(path.read_text()[:200])
    with pytest.raises(report.ReportError, match="cpu_costs/verify_all.json: not valid JSON"):
        report.render(DOC.read_text(), results)


def test_an_index_entry_without_its_commit_is_an_error(tmp_path: Path) -> None:
    results = _copy(tmp_path)
    index = json.loads((results / "records.json").read_text())
    del index["head"]["commit"]
    (results / "records.json").write_text(json.dumps(index))
    with pytest.raises(report.ReportError, match="record 'head' lacks commit"):
        report.render(DOC.read_text(), results)


def test_a_head_record_with_no_rows_is_an_error(tmp_path: Path) -> None:
    results = _copy(tmp_path)
    (results / "head" / "head.txt").write_text("device=cpu\n")
    with pytest.raises(report.ReportError, match="head.txt: no result rows"):
        report.render(DOC.read_text(), results)


def test_missing_markers_are_an_error() -> None:
    doc = DOC.read_text().replace("<!-- /report:trees -->", "")
    with pytest.raises(report.ReportError, match="report:trees"):
        report.render(doc, RESULTS)


def test_charts_are_written_for_the_blocks_that_have_one(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    report.render(DOC.read_text(), RESULTS, tmp_path)
    written = sorted(p.name for p in tmp_path.glob("*.png"))
    assert written == sorted(f"{n}.png" for n in report.BLOCKS if n != "ablation")
    assert all((tmp_path / n).read_bytes()[:4] == b"\x89PNG" for n in written)
