"""SGLang's EAGLE test matrix for NANOSPEC on the CPU (issue 14): the offline ``sglang.Engine``,
chunked prefill, paged KV cache, radix-cache hits and early EOS, each against plain decoding.

Models: the tiny random Llama (512 tokens) and its random full-vocabulary EAGLE-3 draft of the other
server tests. The random target attends over its whole context, so a wrong KV entry (a chunk boundary,
a page, a cached prefix) changes its greedy output; the agreeing targets of other modules ignore the
context and would not show it.

Four SGLang instances, two at a time: the plain server (every reference, and the search for a prompt
whose greedy answer hits EOS early) with NANOSPEC at ``--chunked-prefill-size 4``; then NANOSPEC in
``sglang.Engine`` (single and batch ``generate``, radix-cache hits, EOS; in a process of its own, see
``tests/support/engine_run.py``) with NANOSPEC at ``--page-size 4``.

``--page-size 4``: SGLang 0.5.23's speculative decode allocation (``alloc_for_spec_decode`` ->
``mem_cache/allocation.py: get_last_loc``) calls the Triton kernel ``get_last_loc_triton`` for every
attention backend except ``torch_native``/``ascend``, and Triton has no CPU driver, so without
``patches/sglang_fixes.py``'s ``_fix_allocation`` (SGLang's own ``get_last_loc_torch`` on the CPU) the
scheduler dies at the first decode step with ``RuntimeError: 0 active drivers ([]). There should
only be one.`` The test below fails with that error (``CpuPagedSpecDecodeCrash``) if the fix is gone.

Runtime: 90 s measured on the shared 2-core host; start-ups dominate, so about twice that when the
host is busy.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.plugin_support import last_state, server, spec_args
from tests.support.engine_run import run_engine
from tests.support.sglang_server import SGLangServer
from tests.support.tiny_models import make_tiny_eagle3_draft, make_tiny_llama

VOCAB = 512
EOS = 1
NEW = 12
GREEDY = {"temperature": 0.0, "max_new_tokens": NEW, "ignore_eos": True}
EOS_PARAMS = {"temperature": 0.0, "max_new_tokens": NEW, "ignore_eos": False}
PAGE_CRASH = "0 active drivers"  # Triton's error for a kernel launched without a GPU driver


def _ids(rng: np.random.Generator, n: int) -> list[int]:
    return rng.integers(3, VOCAB, size=n).tolist()  # no BOS/EOS/PAD inside prompts


_rng = np.random.default_rng(14)
SHORT = [_ids(_rng, n) for n in (5, 9, 14, 20)]
LONG = [_ids(_rng, n) for n in (37, 50, 23)]  # not multiples of 4: chunk boundaries inside prompts
BASE = _ids(_rng, 30)
RADIX = {"base": BASE, "again": BASE, "extended": BASE + _ids(_rng, 9), "half": BASE[:15] + _ids(_rng, 12)}
# Candidates for the early-EOS prompt: the plain server answers all of them once and the first whose
# greedy answer ends in EOS after a few tokens is used (so the search follows the model if it changes).
EOS_CANDIDATES = torch.randint(3, VOCAB, (256, 5), generator=torch.Generator().manual_seed(0)).tolist()


class CpuPagedSpecDecodeCrash(RuntimeError):
    """SGLang 0.5.23 launches the Triton kernel ``get_last_loc_triton`` in speculative decoding with
    ``--page-size`` > 1 on the CPU (see the module docstring)."""


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> tuple[Path, Path, Path]:
    root = tmp_path_factory.mktemp("matrix_models")
    target = make_tiny_llama(root / "target", vocab_size=VOCAB)
    draft = make_tiny_eagle3_draft(root / "draft", target)
    return target, draft, tmp_path_factory.mktemp("matrix_logs")


def _gen(srv: SGLangServer, ids, params: dict) -> dict | list[dict]:
    return srv.post("/generate", {"input_ids": ids, "sampling_params": params})


def _view(r: dict) -> dict:
    """What must equal plain decoding's: the tokens and why the request finished."""
    return {"ids": list(r["output_ids"]), "finish": r["meta_info"]["finish_reason"]}


def _find_eos_prompt(plain: SGLangServer) -> list[int]:
    answers = _gen(plain, EOS_CANDIDATES, EOS_PARAMS)
    for prompt, r in zip(EOS_CANDIDATES, answers, strict=True):
        if r["meta_info"]["finish_reason"]["type"] == "stop" and 3 <= len(r["output_ids"]) < NEW:
            return prompt  # EOS from a decode (verify) step, not from the prefill
    pytest.fail("no candidate prompt hits EOS early; enlarge EOS_CANDIDATES")


def _radix_run(srv: SGLangServer) -> dict:
    # One at a time, in this order: each request finds the previous ones' tokens in the radix cache.
    return {name: _gen(srv, ids, GREEDY) for name, ids in RADIX.items()}


@pytest.fixture(scope="module")
def plain_and_chunked(models) -> dict:
    """References from the plain server and NANOSPEC's answers at --chunked-prefill-size 4."""
    target, draft, logs = models
    plain = server(target, [], logs, "matrix_plain")
    chunked = server(target, [*spec_args("NANOSPEC", draft), "--chunked-prefill-size", "4"], logs,
                     "matrix_chunked4")
    try:
        with ThreadPoolExecutor(2) as pool:
            list(pool.map(SGLangServer.start, (plain, chunked)))
        eos_prompt = _find_eos_prompt(plain)
        ref = {"short": [_view(r) for r in _gen(plain, SHORT, GREEDY)],
               "long": [_view(_gen(plain, p, GREEDY)) for p in LONG],
               "radix": {k: _view(v) for k, v in _radix_run(plain).items()},
               "eos": _view(_gen(plain, eos_prompt, EOS_PARAMS))}
        plain.stop()
        got = {"long": [_gen(chunked, p, GREEDY) for p in LONG],
               "long_batch": _gen(chunked, LONG, GREEDY),
               "radix": _radix_run(chunked),
               "eos": _gen(chunked, eos_prompt, EOS_PARAMS)}
        _gen(chunked, SHORT[0], GREEDY)  # one more decode log line after everything else
        got["state"] = last_state(chunked.log_text())
        got["log"] = chunked.log_text()
    finally:
        plain.stop()
        chunked.stop()
    return {"ref": ref, "chunked": got, "eos_prompt": eos_prompt}


def _page_size_run(target: Path, draft: Path, logs: Path, prompts: list[list[int]]) -> dict:
    """NANOSPEC at --page-size 4: the answers, or the scheduler's crash (then stop at once instead of
    waiting out SGLang's 65 s of crash diagnostics)."""
    srv = server(target, [*spec_args("NANOSPEC", draft), "--page-size", "4"], logs, "matrix_page4")
    out: dict = {"answers": None, "error": None}

    def ask() -> None:
        try:
            out["answers"] = [_view(_gen(srv, p, GREEDY)) for p in prompts]
        except Exception as e:  # the server went away under the request
            out["error"] = repr(e)

    with srv:
        worker = threading.Thread(target=ask)
        worker.start()
        deadline = time.monotonic() + 300
        while worker.is_alive() and time.monotonic() < deadline:
            if "Scheduler hit an exception" in srv.log_text():
                time.sleep(1.0)  # let the traceback reach the log
                break
            worker.join(timeout=0.5)
        out["log"] = srv.log_text()
    worker.join(timeout=60)
    return out


@pytest.fixture(scope="module")
def engine_and_paged(models, plain_and_chunked) -> dict:
    target, draft, logs = models
    eos_prompt = plain_and_chunked["eos_prompt"]
    calls = [{"name": "single", "input_ids": SHORT[1], "sampling_params": GREEDY},
             {"name": "batch", "input_ids": SHORT, "sampling_params": GREEDY},
             *({"name": f"radix_{k}", "input_ids": v, "sampling_params": GREEDY} for k, v in RADIX.items()),
             {"name": "eos", "input_ids": eos_prompt, "sampling_params": EOS_PARAMS}]
    spec = {"engine": {"model_path": str(target), "device": "cpu", "dtype": "float32",
                       "attention_backend": "intel_amx", "speculative_algorithm": "NANOSPEC",
                       "speculative_draft_model_path": str(draft), "decode_log_interval": 1,
                       "log_level": "info"},
            "calls": calls}
    with ThreadPoolExecutor(2) as pool:
        engine = pool.submit(run_engine, spec, logs / "engine")
        paged = pool.submit(_page_size_run, target, draft, logs, SHORT)
        return {"engine": engine.result(), "paged": paged.result()}


# -- sglang.Engine ---------------------------------------------------------------------------------

def _engine(engine_and_paged) -> dict:
    result = engine_and_paged["engine"]
    assert "error" not in result, result.get("error")
    return result


def test_engine_single_generate_equals_plain_decoding(engine_and_paged, plain_and_chunked):
    single = _engine(engine_and_paged)["single"]
    assert _view(single) == plain_and_chunked["ref"]["short"][1]
    assert single["meta_info"]["nanospec_draft_steps"] > 0  # NANOSPEC drafted these tokens


def test_engine_batch_generate_equals_plain_decoding(engine_and_paged, plain_and_chunked):
    batch = _engine(engine_and_paged)["batch"]
    assert [_view(r) for r in batch] == plain_and_chunked["ref"]["short"]


def _cached(r: dict) -> int:
    return r["meta_info"]["cached_tokens"]


# Expected cache hits: with EAGLE (NANOSPEC included) SGLang 0.5.23 keys its radix tree by token
# bigrams (srt/mem_cache/radix_cache.py, is_bigram), so a shared prefix of s tokens matches s - 1
# tokens; a repeated prompt matches one token less again, as its last token is always recomputed.
def _expected_hits() -> dict[str, int]:
    return {"base": 0, "again": len(BASE) - 2, "extended": len(BASE) - 1, "half": 15 - 1}


def test_engine_repeated_prompt_hits_the_radix_cache_and_equals_plain_decoding(engine_and_paged,
                                                                               plain_and_chunked):
    engine, ref = _engine(engine_and_paged), plain_and_chunked["ref"]["radix"]
    assert _view(engine["radix_base"]) == _view(engine["radix_again"]) == ref["base"] == ref["again"]
    assert _cached(engine["radix_base"]) == 0
    assert _cached(engine["radix_again"]) == _expected_hits()["again"]


def test_engine_shared_prefix_hits_the_radix_cache_and_equals_plain_decoding(engine_and_paged,
                                                                             plain_and_chunked):
    engine, ref = _engine(engine_and_paged), plain_and_chunked["ref"]["radix"]
    assert _view(engine["radix_extended"]) == ref["extended"]
    assert _view(engine["radix_half"]) == ref["half"]
    assert _cached(engine["radix_extended"]) == _expected_hits()["extended"]
    assert _cached(engine["radix_half"]) == _expected_hits()["half"]


def test_engine_early_eos_gives_plain_decodings_output_and_finish_reason(engine_and_paged,
                                                                         plain_and_chunked):
    ref = plain_and_chunked["ref"]["eos"]
    assert ref["finish"]["type"] == "stop" and len(ref["ids"]) < NEW  # the prompt really hits EOS
    assert _view(_engine(engine_and_paged)["eos"]) == ref


# -- --chunked-prefill-size 4 ----------------------------------------------------------------------

def test_chunked_prefill_of_4_tokens_equals_plain_decoding(plain_and_chunked):
    got, ref = plain_and_chunked["chunked"], plain_and_chunked["ref"]
    assert [_view(r) for r in got["long"]] == ref["long"]
    assert [_view(r) for r in got["long_batch"]] == ref["long"]  # three prompts chunked side by side
    assert "chunked_prefill_size=4" in got["log"]


def test_chunked_prefill_keeps_no_partial_prompts_afterwards(plain_and_chunked):
    state = plain_and_chunked["chunked"]["state"]
    assert state is not None and state["pending"] == 0 and state["live"] <= 1


def test_chunked_prefill_with_radix_cache_hits_equals_plain_decoding(plain_and_chunked):
    got, ref = plain_and_chunked["chunked"]["radix"], plain_and_chunked["ref"]["radix"]
    assert {k: _view(v) for k, v in got.items()} == ref
    assert {k: _cached(v) for k, v in got.items()} == _expected_hits()  # chunks hit the cache alike


def test_chunked_prefill_early_eos_gives_plain_decodings_output_and_finish_reason(plain_and_chunked):
    assert _view(plain_and_chunked["chunked"]["eos"]) == plain_and_chunked["ref"]["eos"]


# -- --page-size 4 ---------------------------------------------------------------------------------

def test_page_size_4_equals_plain_decoding(engine_and_paged, plain_and_chunked):
    paged = engine_and_paged["paged"]
    if paged["answers"] is None:
        log = paged["log"]
        if PAGE_CRASH in log and "get_last_loc_triton" in log:
            start = log.index("Scheduler hit an exception")
            raise CpuPagedSpecDecodeCrash(log[start:start + 400] + " ... " + log[log.index(PAGE_CRASH) - 200:]
                                          [:300])
        pytest.fail(f"--page-size 4 failed otherwise: {paged['error']}\n{log[-3000:]}")
    assert paged["answers"] == plain_and_chunked["ref"]["short"]
