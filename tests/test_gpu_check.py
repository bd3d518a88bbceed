"""nanospec.bench.gpu_check on the CPU: its dry run passes and prints every check exactly once, its
reports are written, and its comparisons report a broken state, broken logits or stale packed rows in
the loop as FAIL (so it cannot pass by always saying PASS)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from nanospec import DynamicVocab, NanoSpecConfig
from nanospec.bench import gpu_check, gpu_loop

ROOT = Path(__file__).resolve().parents[1]
CHECKS = ("imports", "loop", "kernels_match", "cuda_graph_heads", "side_stream_race", "no_host_sync",
          "head_timing", "memory")
LINE = re.compile(r"^(PASS|FAIL|SKIP) (\w+): ")


def _run(*args: str, interpret: bool) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    if interpret:
        env["TRITON_INTERPRET"] = "1"
    return subprocess.run([sys.executable, "-m", "nanospec.bench.gpu_check", "--dry", *args], cwd=ROOT,
                          capture_output=True, text=True, env=env, timeout=300)


def _statuses(stdout: str) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for line in stdout.splitlines():
        m = LINE.match(line)
        if m:
            found.setdefault(m.group(2), []).append(m.group(1))
    return found


# -- the command ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("interpret", [False, True], ids=["plain", "triton-interpreter"])
def test_dry_run_passes_and_prints_every_check_once(interpret: bool, tmp_path: Path):
    proc = _run("--out", str(tmp_path), interpret=interpret)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("gpu_check ") and "torch=" in lines[0] and "triton=" in lines[0]
    found = _statuses(proc.stdout)
    assert sorted(found) == sorted(CHECKS) and all(len(v) == 1 for v in found.values()), found
    assert not any(line.startswith("FAIL") for line in lines)
    # The CUDA-only checks say why they did not run; kernels_match runs only under the interpreter.
    assert [found[n][0] for n in ("cuda_graph_heads", "side_stream_race", "no_host_sync")] == ["SKIP"] * 3
    assert found["kernels_match"] == (["PASS"] if interpret else ["SKIP"])
    assert found["imports"] == found["memory"] == found["head_timing"] == found["loop"] == ["PASS"]
    assert (tmp_path / "gpu_check.txt").read_text().splitlines() == lines
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert {n: c["status"] for n, c in report["checks"].items()} == {n: v[0] for n, v in found.items()}
    loop = report["checks"]["loop"]["data"]
    shape = gpu_loop.DRY_LOOP
    full, reduced = loop[f"full V_d={shape.vocab}"], loop[f"reduced V_d={shape.draft_vocab}"]
    assert full["ids_compared"] > 0 and reduced["ids_compared"] > 0
    # Graphs (eager callables here) replayed with fewer live requests than they were built for.
    assert any(b < p for b, p in full["batch_on_graph"])
    assert loop["times"]["B=2"]["full head"]["vs_full_head"] == 1.0
    md = (tmp_path / "gpu_check.md").read_text()
    assert "| loop | PASS |" in md and "| packed draft step |" in md


def test_injected_fault_is_a_fail_with_nonzero_exit():
    proc = _run("--only", "kernels_match", "--inject-fault", interpret=True)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert _statuses(proc.stdout) == {"kernels_match": ["FAIL"]}
    assert "pos not bit-identical" in proc.stdout


def test_planted_stale_rows_fail_the_loop_check():
    proc = _run("--only", "loop", "--plant-stale-rows", interpret=False)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert _statuses(proc.stdout) == {"loop": ["FAIL"]}
    assert "token ids differ from the reference" in proc.stdout and "--plant-stale-rows" in proc.stdout


@pytest.mark.parametrize("reduced", [False, True], ids=["full-vocab", "reduced-vocab"])
def test_loop_sees_rows_gathered_after_verify_go_stale(reduced: bool, monkeypatch):
    # Gathers at start are right; only those of after_verify skip rows: the draft-extend's hidden
    # points at just-accepted tokens, so their stale rows must change the ids.
    real = gpu_loop.Proposer.after_verify

    def after_verify(self, **kw):
        ops = self.dv.head.ops
        self.dv.head.ops = gpu_loop.SkipGather(ops)
        try:
            return real(self, **kw)
        finally:
            self.dv.head.ops = ops

    monkeypatch.setattr(gpu_loop.Proposer, "after_verify", after_verify)
    stats = gpu_loop.run_loop(gpu_loop.DRY_LOOP, reduced, cuda=False, seconds=60, max_rounds=30)
    assert stats.mismatch and "token ids differ" in stats.mismatch
    monkeypatch.undo()
    clean = gpu_loop.run_loop(gpu_loop.DRY_LOOP, reduced, cuda=False, seconds=60, max_rounds=30)
    assert clean.mismatch is None and clean.rounds == 30


# -- the comparisons -------------------------------------------------------------------------------------

def _pair() -> tuple[DynamicVocab, DynamicVocab]:
    weight, cfg = torch.randn(40, 8), NanoSpecConfig(w_max=6)
    pair = (DynamicVocab(weight, 2, cfg), DynamicVocab(weight, 2, cfg))
    for dv in pair:
        dv.start(0, torch.tensor([1, 2, 3, 2]), torch.tensor([[4, 5], [6, 1], [7, 8], [9, 4]]))
        dv.start(1, torch.tensor([30]))
    return pair


def test_state_comparison_names_each_buffer_that_differs():
    a, b = _pair()
    assert gpu_check.state_mismatches(a, b) == []
    b.state.count[1, 0] += 1
    assert gpu_check.state_mismatches(a, b) == ["count"]
    a.state.count[1, 0] += 1
    a.head.packed[0, 0, 0] = 0.0
    b.head.packed[0, 0, 0] = -0.0  # equal values, different bits: a copy must keep the bits
    assert gpu_check.state_mismatches(a, b) == ["packed"]


def test_state_invariants_catch_what_both_back_ends_could_share():
    a, _ = _pair()
    assert gpu_check.state_violations(a, [0, 1]) == []
    a.state.count[0, 0] = -1
    assert "negative count" in gpu_check.state_violations(a, [0, 1])
    a, _ = _pair()
    a.state.nfree[1] += 1
    assert gpu_check.state_violations(a, [0, 1]) == ["nfree != W - live columns"]
    a, _ = _pair()
    a.state.col_of[0, 2] = 0  # token 2 left the window, yet claims a column
    assert gpu_check.state_violations(a, [0, 1]) == ["col_of is not the inverse of col_tok"]


def test_logits_comparison_catches_wrong_values_and_wrong_free_columns():
    ref = torch.tensor([[1.0, -2.0, float("-inf")], [0.5, float("-inf"), 3.0]])
    assert gpu_check.compare_logits(ref.clone(), ref, gpu_check.TIGHT_TOL)[1] is None
    assert gpu_check.compare_logits(ref + 1e-3, ref, gpu_check.BF16_TOL)[1] is None
    off = ref.clone()
    off[1, 2] = 3.1
    err, msg = gpu_check.compare_logits(off, ref, gpu_check.TIGHT_TOL)
    assert msg.startswith("1 of 4 logits off") and err == pytest.approx(0.1 / 3.0, rel=1e-3)
    freed = ref.clone()
    freed[0, 2] = 0.0
    assert "-inf pattern" in gpu_check.compare_logits(freed, ref, gpu_check.BF16_TOL)[1]


def test_reference_logits_use_the_named_rows_and_minus_inf_for_free_columns():
    weight, hidden = torch.randn(10, 4), torch.randn(2, 4)
    per_row = gpu_check.reference_logits(weight, hidden, torch.tensor([[3, -1], [0, 9]]))
    assert torch.allclose(per_row[0, 0], hidden[0] @ weight[3]) and torch.isneginf(per_row[0, 1])
    assert torch.allclose(per_row[1], weight[[0, 9]] @ hidden[1])
    shared = gpu_check.reference_logits(weight, hidden, torch.tensor([7, -1]))
    assert torch.allclose(shared[:, 0], hidden @ weight[7]) and torch.isneginf(shared[:, 1]).all()


def test_forbidden_and_unknown_imports_are_named():
    assert gpu_check.foreign_modules(["nanospec", "numpy", "json", "_ctypes"]) == ([], [])
    assert gpu_check.foreign_modules(["sglang", "yaml", "torch"]) == (["sglang"], ["yaml"])


# -- the driver -------------------------------------------------------------------------------------------

def test_a_failing_or_crashing_check_fails_the_run_and_the_others_still_run():
    def crash(ctx):
        raise RuntimeError("boom")

    lines: list[str] = []
    checks = [("ok", lambda ctx: gpu_check.passed("fine")), ("bad", crash),
              ("skipped", lambda ctx: gpu_check.skipped("why"))]
    assert gpu_check.run(checks, gpu_check.Ctx(cuda=False, interpret=False), lines.append) == 1
    assert [line.split(":")[0] for line in lines[1:4]] == ["PASS ok", "FAIL bad", "SKIP skipped"]
    assert "RuntimeError: boom (at tests/test_gpu_check.py:" in lines[2]
    assert lines[-1].startswith("gpu_check: 1 PASS, 1 FAIL, 1 SKIP")
    assert gpu_check.run(checks[::2], gpu_check.Ctx(cuda=False, interpret=False), lines.append) == 0


def test_crossover_is_interpolated_where_the_full_head_catches_up():
    got = gpu_check.measured_crossover([1, 4, 16], [1.0, 2.0, 6.0], [3.0, 3.0, 4.0])
    assert got == "~8.0 (between 4 and 16)"
    assert gpu_check.measured_crossover([1, 4], [1.0, 2.0], [3.0, 3.0]).startswith("> 4")
    # Without overlap the policy's break-even is near V / W requests (41.75 at Llama-3 sizes).
    assert gpu_check.policy_crossover(gpu_check.LLAMA3) == "B=43"
