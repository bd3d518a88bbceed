"""Run SGLang's offline ``sglang.Engine`` in a process of its own and write what it generated as JSON.

    python -m tests.support.engine_run --spec SPEC.json --out OUT.json

``SPEC.json``: ``{"engine": {Engine keyword arguments}, "calls": [{"name": ..., "input_ids": ids or
[ids, ...], "sampling_params": {...}}, ...]}``. Each call is one ``Engine.generate`` (a list of
prompts is one batch call); ``OUT.json`` maps each name to the result (a dict or a list of dicts:
``output_ids``, ``text``, ``meta_info``), plus ``"error"`` if something raised.

Why a process of its own: SGLang decides CPU or CUDA from ``SGLANG_USE_CPU_ENGINE`` when its modules
are first imported (``srt/utils/common.py: is_cpu``, read into module constants), and NanoSpec's
start-up hook sets that variable only for ``python -m sglang.*`` runs; here it is set before the first
import. Also, the engine's scheduler is a child of this process, so stopping the process group stops
everything (``run_engine``).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import traceback
from pathlib import Path


def run_engine(spec: dict, work: Path, *, timeout: float = 400.0) -> dict:
    """Run the spec in a child process (own process group, killed on timeout); return OUT.json."""
    work.mkdir(parents=True, exist_ok=True)
    spec_path, out_path, log_path = work / "spec.json", work / "out.json", work / "engine.log"
    spec_path.write_text(json.dumps(spec))
    env = {**os.environ, "SGLANG_USE_CPU_ENGINE": "1"}
    env.setdefault("OMP_NUM_THREADS", "1")  # tiny models on a shared host (tests/support/sglang_server.py)
    cmd = [sys.executable, "-m", "tests.support.engine_run", "--spec", str(spec_path), "--out", str(out_path)]
    root = Path(__file__).resolve().parents[2]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pass
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # the scheduler child too, whatever happened
            except ProcessLookupError:
                pass
            proc.wait()
    if not out_path.exists():
        tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-60:])
        raise RuntimeError(f"engine run wrote no result (exit {proc.returncode}); log {log_path}:\n{tail}")
    result = json.loads(out_path.read_text())
    result["log"] = log_path.read_text(errors="replace")
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--spec", required=True)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    spec = json.loads(Path(args.spec).read_text())
    out: dict = {}
    engine = None
    try:
        import sglang

        engine = sglang.Engine(**spec["engine"])
        for call in spec["calls"]:
            out[call["name"]] = engine.generate(input_ids=call["input_ids"],
                                                sampling_params=call["sampling_params"])
    except Exception:
        out["error"] = traceback.format_exc()
    finally:
        if engine is not None:
            try:
                engine.shutdown()
            except Exception:
                out.setdefault("shutdown_error", traceback.format_exc())
    Path(args.out).write_text(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
