"""Shared set-up of the NANOSPEC plugin's server tests: tiny models, server arguments, prompts."""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor

from tests.support.sglang_server import SGLangServer

BASE_ARGS = ["--dtype", "float32", "--attention-backend", "intel_amx", "--decode-log-interval", "1"]

PROMPTS = [
    "Hello world",
    "The quick brown fox jumps over the lazy dog.",
    "Write a short story about a robot who learns to paint.",
    "Explain how a hash table works and when to use one.",
    "What are the main differences between Python and JavaScript?",
    "Give three tips for staying healthy.",
    "A journey of a thousand miles begins with a single step.",
    "Frequent pairs of pieces are merged into longer pieces",
]


def spec_args(algo: str, draft) -> list[str]:
    return ["--speculative-algorithm", algo, "--speculative-draft-model-path", str(draft)]


def server(model, args, log_dir, name: str, env: dict | None = None) -> SGLangServer:
    return SGLangServer(model, args=BASE_ARGS + list(args), env=env, log_path=log_dir / f"{name}.log",
                        startup_timeout=300)


def generate_all(srv: SGLangServer, prompts, *, concurrent: bool, max_new_tokens: int = 24, **sampling):
    def one(p):
        return srv.generate(p, max_new_tokens=max_new_tokens, **sampling)

    if not concurrent:
        return [one(p) for p in prompts]
    with ThreadPoolExecutor(max_workers=len(prompts)) as pool:
        return list(pool.map(one, prompts))


def output_ids(resp: dict) -> list[int]:
    return list(resp["output_ids"]) if "output_ids" in resp else resp["text"]


STATE_RE = re.compile(r"live: (\d+), started: (\d+), slots used: (\d+), pending prompts: (\d+), "
                      r"state bytes: (\d+)")


def last_state(log: str) -> dict[str, int] | None:
    """NanoSpec's state as printed on the last decode log line of a server log."""
    found = STATE_RE.findall(log)
    if not found:
        return None
    live, started, used, pending, nbytes = (int(x) for x in found[-1])
    return {"live": live, "started": started, "slots_used": used, "pending": pending, "bytes": nbytes}
