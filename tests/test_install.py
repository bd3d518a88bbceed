"""`pip install .` (not editable) gives a working product: build the wheel from a copy of the sources, install
it with --no-deps into a fresh folder and run the entry points from a directory outside the repository,
with the repository off sys.path.

The folder stands in for site-packages: the interpreter runs with ``-S`` (no site, so none of .venv's
``.pth`` files run, the editable install's path to this checkout included) and ``PYTHONPATH=INSTALLED:
VENV_SITE_PACKAGES`` (INSTALLED first: the wheel's ``nanospec`` and its dist-info win); the CPU hook's
``.pth`` is run by ``site.addsitedir(INSTALLED)``, as site does at start-up for a real site-packages.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SITE = sysconfig.get_paths()["purelib"]  # .venv's site-packages: torch, transformers, sglang, ...


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel of a copy of the sources, with a stand-in shipped draft in nanospec/drafts/."""
    src = tmp_path_factory.mktemp("src")
    skip = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(ROOT / "nanospec", src / "nanospec", ignore=skip)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    draft = src / "nanospec" / "drafts" / "tiny-draft"
    shutil.rmtree(draft.parent, ignore_errors=True)  # only the stand-in: real drafts are large
    draft.mkdir(parents=True)
    (draft / "config.json").write_text("{}\n")
    (draft / "model.safetensors").write_bytes(b"\0" * 16)
    out = tmp_path_factory.mktemp("wheel")
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), str(src)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (whl,) = out.glob("nanospec-*.whl")
    return whl


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory) -> Path:
    target = tmp_path_factory.mktemp("site")
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-compile",
                           "--target", str(target), str(wheel)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return target


def run_installed(installed: Path, args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "SGLANG_USE_CPU_ENGINE")}
    env.update(PYTHONPATH=f"{installed}{os.pathsep}{SITE}", OMP_NUM_THREADS="1", PYTHONNOUSERSITE="1")
    return subprocess.run([sys.executable, "-S", *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=300)


def test_wheel_ships_one_top_level_package_its_data_and_the_cpu_hook(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names}
    assert top == {"nanospec", "nanospec_sgl_cpu.pth", "nanospec-0.1.0.dist-info"}, top
    for path in ("nanospec/data/mt_bench.jsonl", "nanospec/drafts/tiny-draft/config.json",
                 "nanospec/drafts/tiny-draft/model.safetensors", "nanospec/cpu/sgl_kernel/__init__.py",
                 "nanospec/train/__main__.py", "nanospec/testing.py"):
        assert path in names, path
    assert "nanospec/cpu/nanospec_sgl_cpu.pth" not in names  # the hook lands once, at the top
    entry_points = zipfile.ZipFile(wheel).read("nanospec-0.1.0.dist-info/entry_points.txt").decode()
    assert "[sglang.srt.plugins]" in entry_points and "nanospec = nanospec.sglang:register" in entry_points


def test_installed_product_imports_nothing_from_the_repository(installed, tmp_path):
    assert not {"patches", "train", "tests"} & {p.name for p in installed.iterdir()}
    for path in (installed / "nanospec").rglob("*.py"):
        text = path.read_text()
        assert "from tests" not in text and "import tests" not in text, path
    code = textwrap.dedent(f"""
        import importlib.metadata, json, site, sys
        site.addsitedir({str(installed)!r})  # runs nanospec_sgl_cpu.pth as site does at start-up
        hook = [type(f).__module__ for f in sys.meta_path if type(f).__name__ == "NanoSpecFinder"]
        cheap = "torch" not in sys.modules  # the hook and `import nanospec` load no torch
        import nanospec, nanospec.cpu, nanospec.train, nanospec.testing
        import sgl_kernel  # the real one cannot load on this CPU host: the pure-PyTorch fallback
        from nanospec.data import packaged_questions
        plugins = importlib.metadata.entry_points(group="sglang.srt.plugins")
        (ep,) = [e for e in plugins if e.name == "nanospec"]
        modules = (nanospec, nanospec.cpu, nanospec.train, nanospec.testing)
        print(json.dumps({{"hook": hook, "cheap": cheap, "files": [m.__file__ for m in modules],
                          "questions": str(packaged_questions()),
                          "fallback": getattr(sgl_kernel, "__nanospec_fallback__", False),
                          "entry_point": ep.value, "dist": str(ep.dist.locate_file(""))}}))
    """)
    proc = run_installed(installed, ["-c", code], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(proc.stdout.splitlines()[-1])
    assert res["hook"] == ["nanospec.cpu._bootstrap"] and res["cheap"]
    assert all(f.startswith(str(installed)) for f in [*res["files"], res["questions"]]), res
    assert res["fallback"] and res["entry_point"] == "nanospec.sglang:register"
    assert res["dist"].startswith(str(installed))


def test_entry_points_run_from_any_directory(installed, tmp_path):
    proc = run_installed(installed, ["-m", "nanospec.train", "--help"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "--target-model-path" in proc.stdout and "--sampled-softmax" in proc.stdout
    # The other commands' --help in one interpreter (the imports dominate), each as `python -m` runs it.
    modules = ["nanospec.demo", "nanospec.train.export", "nanospec.train.evaluate",
               "nanospec.bench.specbench", "nanospec.bench.coverage", "nanospec.bench.head",
               "nanospec.cpu.bench", "nanospec.cpu.bench_verify", "nanospec.models"]
    code = textwrap.dedent(f"""
        import runpy, sys
        for name in {modules!r}:
            sys.argv = [name, "--help"]
            try:
                runpy.run_module(name, run_name="__main__", alter_sys=True)
            except SystemExit as e:
                assert e.code in (0, None), (name, e.code)
            else:
                raise AssertionError(name + " --help did not exit")
            print("OK", name, flush=True)
    """)
    proc = run_installed(installed, ["-c", code], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ok = [line.split()[1] for line in proc.stdout.splitlines() if line.startswith("OK ")]
    assert ok == modules
    assert "nanospec/data" in proc.stdout  # the packaged defaults
    assert not list(tmp_path.iterdir())  # --help writes nothing into the working directory
