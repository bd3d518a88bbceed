"""Load and faults through the real SGLang server: NANOSPEC under mixed traffic, then checks (issue 14).

    .venv/bin/python scripts/load_check.py [--sequential 200] [--concurrent 50] [--rounds 1]
        [--rss-bound-mib 64] [--algorithm NANOSPEC|EAGLE3|none] [--server-args FLAGS]
        [--out FILE] [--json FILE]

Tiny random models (``nanospec.testing``: a 512-token Llama and its full-vocabulary EAGLE-3 draft,
float32) are served twice on the CPU: plainly (AR) and with ``--speculative-algorithm NANOSPEC``.
Requests cycle through five kinds: greedy, sampled (temperature 1, top-p 0.9), regex-constrained
greedy, streamed greedy, and streamed greedy that the client abandons after 3 chunks by closing the
connection (so a fifth are aborted mid-stream). Every request has its own prompt (8 base prompts plus a
request number, so they share prefixes in the radix cache).

Phases on the NANOSPEC server: warm-up (10 sequential and one concurrent burst of ``--concurrent``
requests, so that the allocators have seen the largest batch), ``--sequential`` requests one at a
time, ``--concurrent`` requests all at once, then one fresh short request whose decode log line shows
NanoSpec's state (``--rounds K`` repeats the sequential and concurrent phases K times, to tell a
leak, which grows every round, from allocator caches, which level off). The AR server answers the
same greedy, regex and streamed prompts (one-shot) first and is stopped before the load starts.

Checks (exit status 1 if one fails; the summary lists each):
- every request answered without an HTTP error (aborted ones: the stream delivered its 3 chunks);
- no ``Traceback`` in either server's log once it is ready (SGLang's own start-up race, "post-warmup
  freeze_gc failed", is reported separately);
- every non-aborted greedy, regex and streamed output equals AR's token for token;
- sampled outputs have the requested length and valid token ids;
- NanoSpec's state after the load is empty: the last decode log line, printed by the probe's last
  step after SGLang freed its row, says ``live: 0`` and ``pending prompts: 0``; ``started`` counts
  every request; fewer slots were used than requests were sent (slots are reused);
- the scheduler's resident memory (``VmRSS`` of the process titled ``sglang::scheduler`` in the
  server's process group) grew by at most ``--rss-bound-mib`` from the end of the warm-up to the end;
- every phase finished within ``--deadline`` seconds in total.

``--algorithm EAGLE3`` / ``none`` runs the same load against SGLang alone (the NanoSpec state checks are
skipped), to tell NanoSpec's behaviour from SGLang's; the RSS comparison in docs/plugin.md was made so.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import sys
import tempfile
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script: the test helpers live in the repository's tests/
    sys.path.insert(0, str(ROOT))

from tests.plugin_support import BASE_ARGS, PROMPTS, last_state, spec_args  # noqa: E402
from tests.support.sglang_server import SGLangServer  # noqa: E402

KINDS = ("greedy", "sampled", "regex", "stream", "abort")
GREEDY_KINDS = ("greedy", "regex", "stream")  # compared with AR
REGEX = r"[a-z]+( [a-z]+){2,6}\."
ABORT_AFTER_CHUNKS = 3
VOCAB = 512
WARMUP_SEQUENTIAL = 10


@dataclass
class Request:
    index: int
    phase: str
    kind: str
    prompt: str
    params: dict


@dataclass
class Result:
    request: Request
    ok: bool
    output_ids: list[int] = field(default_factory=list)
    finish: str | None = None
    chunks: int = 0
    error: str | None = None
    seconds: float = 0.0


def make_requests(phase: str, count: int, start: int, max_new: int, kinds=KINDS) -> list[Request]:
    out = []
    for j in range(count):
        i = start + j
        kind = kinds[i % len(kinds)]
        params: dict = {"temperature": 0.0, "max_new_tokens": max_new, "ignore_eos": True}
        if kind == "sampled":
            params.update(temperature=1.0, top_p=0.9)
        elif kind == "regex":
            params.update(regex=REGEX, ignore_eos=False, max_new_tokens=max(max_new, 24))
        elif kind == "abort":
            params["max_new_tokens"] = 400  # long enough to be cut mid-stream
        out.append(Request(i, phase, kind, f"{PROMPTS[i % len(PROMPTS)]} (request {i})", params))
    return out


def _post(url: str, payload: dict, timeout: float):
    req = urllib.request.Request(url, data=json.dumps(payload).encode(),
                                 headers={"Content-Type": "application/json"})
    return urllib.request.urlopen(req, timeout=timeout)


def send(base_url: str, r: Request, timeout: float, *, stream: bool | None = None) -> Result:
    """One request; streamed kinds read ``data:`` lines (an abort closes the connection early)."""
    stream = r.kind in ("stream", "abort") if stream is None else stream
    payload = {"text": r.prompt, "sampling_params": r.params, "stream": stream}
    t0 = time.monotonic()
    try:
        with _post(base_url + "/generate", payload, timeout) as resp:
            if not stream:
                body = json.loads(resp.read())
                return Result(r, True, list(body["output_ids"]), body["meta_info"]["finish_reason"]["type"],
                              seconds=time.monotonic() - t0)
            last, chunks = None, 0
            for line in resp:
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    break
                last, chunks = json.loads(data), chunks + 1
                if r.kind == "abort" and chunks >= ABORT_AFTER_CHUNKS:
                    break  # leaving the block closes the connection: the server aborts the request
            if r.kind == "abort":
                return Result(r, chunks >= ABORT_AFTER_CHUNKS, chunks=chunks, seconds=time.monotonic() - t0,
                              error=None if chunks >= ABORT_AFTER_CHUNKS else f"stream ended at {chunks}")
            if last is None:
                return Result(r, False, error="empty stream", seconds=time.monotonic() - t0)
            finish = (last["meta_info"].get("finish_reason") or {}).get("type")
            return Result(r, True, list(last["output_ids"]), finish, chunks, seconds=time.monotonic() - t0)
    except urllib.error.HTTPError as e:
        return Result(r, False, error=f"HTTP {e.code}: {e.read()[:300]!r}", seconds=time.monotonic() - t0)
    except (urllib.error.URLError, OSError, ValueError, KeyError) as e:
        return Result(r, False, error=f"{type(e).__name__}: {e}", seconds=time.monotonic() - t0)


def run_phase(base_url: str, requests: list[Request], timeout: float, concurrent: bool) -> list[Result]:
    if not concurrent:
        return [send(base_url, r, timeout) for r in requests]
    with ThreadPoolExecutor(max_workers=len(requests)) as pool:
        return list(pool.map(lambda r: send(base_url, r, timeout), requests))


def group_members(pid: int) -> list[int]:
    """Pids of the processes in ``pid``'s process group (the server's launcher, scheduler, detokenizer)."""
    pgid = os.getpgid(pid)
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) ": state ppid pgrp ...
        if int(fields[2]) == pgid:
            members.append(int(entry.name))
    return members


def rss_mib(pid: int) -> float | None:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    m = re.search(r"^VmRSS:\s+(\d+) kB", status, re.M)
    return int(m.group(1)) / 1024 if m else None


def scheduler_pid(srv: SGLangServer) -> int:
    """The scheduler, by the title SGLang gives it; the group's largest process if none has it."""
    members = group_members(srv.process.pid)
    for pid in members:
        try:
            title = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        if b"sglang::scheduler" in title:
            return pid
    return max(members, key=lambda p: rss_mib(p) or 0.0)


def group_rss(srv: SGLangServer) -> dict[int, float]:
    return {pid: mib for pid in group_members(srv.process.pid) if (mib := rss_mib(pid)) is not None}


def build_models(root: Path) -> tuple[Path, Path]:
    from nanospec.testing import make_tiny_eagle3_draft, make_tiny_llama

    target = make_tiny_llama(root / "target", vocab_size=VOCAB)
    return target, make_tiny_eagle3_draft(root / "draft", target)


def check(args: argparse.Namespace) -> dict:
    t_start = time.monotonic()
    work = Path(args.workdir or tempfile.mkdtemp(prefix="nanospec_load_"))
    work.mkdir(parents=True, exist_ok=True)
    target, draft = build_models(work / "models")
    deadline = t_start + args.deadline
    failures: list[str] = []
    timings: dict[str, float] = {}

    warmup = (make_requests("warmup", WARMUP_SEQUENTIAL, 0, args.max_new_tokens)
              + make_requests("warmup", args.concurrent, WARMUP_SEQUENTIAL, args.max_new_tokens))
    phases = [("warmup_sequential", warmup[:WARMUP_SEQUENTIAL], False),
              ("warmup_concurrent", warmup[WARMUP_SEQUENTIAL:], True)]
    n = len(warmup)
    for k in range(args.rounds):  # more rounds tell a leak (growth each round) from a plateau
        suffix = "" if args.rounds == 1 else f"_{k + 1}"
        sequential = make_requests("sequential", args.sequential, n, args.max_new_tokens)
        concurrent = make_requests("concurrent", args.concurrent, n + args.sequential, args.max_new_tokens)
        n += args.sequential + args.concurrent
        phases += [(f"sequential{suffix}", sequential, False), (f"concurrent{suffix}", concurrent, True)]
    everything = [r for _, reqs, _ in phases for r in reqs]
    compared = [r for r in everything if r.kind in GREEDY_KINDS]

    def mk(name: str, extra: list[str]) -> SGLangServer:
        return SGLangServer(target, args=[*BASE_ARGS, *extra], log_path=work / f"{name}.log",
                            startup_timeout=args.startup_timeout)

    ar = mk("ar", [])
    # The server under test: NANOSPEC, or (to compare what SGLang alone does under the same load)
    # EAGLE3 with the same draft or plain decoding; --server-args appends flags (--disable-radix-cache).
    under_test = [] if args.algorithm == "none" else spec_args(args.algorithm, draft)
    nano = mk("nanospec" if args.algorithm == "NANOSPEC" else f"under_test_{args.algorithm}",
              [*under_test, *shlex.split(args.server_args)])
    try:
        t0 = time.monotonic()
        with ThreadPoolExecutor(2) as pool:  # start-up dominates on this host: overlap the two
            list(pool.map(SGLangServer.start, (ar, nano)))
        timings["start_both_servers"] = time.monotonic() - t0
        # SGLang 0.5.23 can log one traceback during start-up ("post-warmup freeze_gc failed": it posts
        # to its own port before uvicorn listens); only what the servers log after they are ready counts.
        ready_at = {"ar": len(ar.log_text()), "nanospec": len(nano.log_text())}

        t0 = time.monotonic()
        with ThreadPoolExecutor(8) as pool:
            ar_results = list(pool.map(lambda r: send(ar.base_url, r, args.request_timeout, stream=False),
                                       compared))
        timings["ar_reference"] = time.monotonic() - t0
        reference = {res.request.index: res for res in ar_results}
        failures += [f"AR request {res.request.index} ({res.request.kind}): {res.error}"
                     for res in ar_results if not res.ok]
        ar_log = ar.log_text()
        ar.stop()

        rss: dict[str, float] = {}
        sched = scheduler_pid(nano)
        rss["after_start"] = rss_mib(sched) or 0.0
        results: list[Result] = []
        for phase, reqs, conc in phases:
            if time.monotonic() > deadline:
                failures.append(f"deadline of {args.deadline:.0f} s passed before phase {phase}")
                break
            t0 = time.monotonic()
            results += run_phase(nano.base_url, reqs, args.request_timeout, conc)
            timings[phase] = time.monotonic() - t0
            rss[f"after_{phase}"] = rss_mib(sched) or 0.0

        # The aborted streams' requests end on the server a moment after the client leaves; then one
        # fresh request prints a decode log line with NanoSpec's state.
        time.sleep(2.0)
        probe = send(nano.base_url, Request(-1, "probe", "greedy", PROMPTS[0], {
            "temperature": 0.0, "max_new_tokens": 6, "ignore_eos": True}), args.request_timeout)
        time.sleep(0.5)  # the log line is flushed by the scheduler, the response by the HTTP server
        rss["after_probe"] = rss_mib(sched) or 0.0
        group = group_rss(nano)
        nano_log = nano.log_text()
    finally:
        ar.stop()
        nano.stop()
    timings["total"] = time.monotonic() - t_start
    if time.monotonic() > deadline:
        failures.append(f"took {timings['total']:.0f} s, over the deadline of {args.deadline:.0f} s")

    # -- checks ------------------------------------------------------------------------------------
    errors = [f"{r.request.phase} {r.request.index} ({r.request.kind}): {r.error}"
              for r in results if not r.ok]
    http_5xx = sum(1 for r in results if r.error and r.error.startswith("HTTP 5"))
    failures += errors
    if not probe.ok:
        failures.append(f"probe request: {probe.error}")
    marker = "Traceback (most recent call last)"
    tracebacks = {"nanospec": nano_log[ready_at["nanospec"]:].count(marker),
                  "ar": ar_log[ready_at["ar"]:].count(marker)}
    startup_tracebacks = {"nanospec": nano_log[:ready_at["nanospec"]].count(marker),
                          "ar": ar_log[:ready_at["ar"]].count(marker)}
    failures += [f"{k} server log has {v} traceback(s) after start-up" for k, v in tracebacks.items() if v]

    mismatches = []
    for r in results:
        ref = reference.get(r.request.index)
        if r.ok and r.request.kind in GREEDY_KINDS and ref is not None and ref.ok:
            if r.output_ids != ref.output_ids or r.finish != ref.finish:
                mismatches.append(r.request.index)
    if mismatches:
        failures.append(f"{len(mismatches)} greedy outputs differ from AR's: requests {mismatches[:20]}")
    bad_samples = [r.request.index for r in results if r.ok and r.request.kind == "sampled"
                   and (len(r.output_ids) != r.request.params["max_new_tokens"]
                        or not all(0 <= t < VOCAB for t in r.output_ids))]
    failures += [f"sampled outputs of wrong length or ids: {bad_samples[:20]}"] if bad_samples else []

    state = last_state(nano_log)
    slots_m = re.search(r"; (\d+) slots, vocabulary state", nano_log)
    slots = int(slots_m.group(1)) if slots_m else None
    sent = len(results) + 1
    if args.algorithm != "NANOSPEC":
        pass  # no NanoSpec state to check
    elif state is None:
        failures.append("no NanoSpec state line in the server log")
    else:
        # The probe's last decode step logs after SGLang freed its row: every slot is free by then.
        if state["live"] != 0:
            failures.append(f"{state['live']} live slots after the probe finished (expected 0)")
        if state["pending"] != 0:
            failures.append(f"{state['pending']} pending prompts after the load (expected 0)")
        if state["started"] < sent:
            failures.append(f"started {state['started']} < {sent} requests sent")
        if slots is not None and not state["slots_used"] <= slots < sent:
            failures.append(f"slots used {state['slots_used']} of {slots} for {sent} requests")

    growth = rss["after_probe"] - rss.get("after_warmup_concurrent", rss["after_start"])
    if growth > args.rss_bound_mib:
        failures.append(f"scheduler RSS grew by {growth:.1f} MiB after the warm-up "
                        f"(bound {args.rss_bound_mib} MiB)")

    load = [r for r in results if r.request.phase != "warmup"]
    by_kind = {k: sum(1 for r in load if r.request.kind == k) for k in KINDS}
    aborted = sum(1 for r in results if r.request.kind == "abort" and r.ok)
    return {
        "args": {"algorithm": args.algorithm, "server_args": args.server_args,
                 "sequential": args.sequential, "concurrent": args.concurrent, "rounds": args.rounds,
                 "max_new_tokens": args.max_new_tokens, "warmup": len(warmup)},
        "requests": {"total_incl_warmup": len(results), "load": len(load),
                     "by_kind_load": by_kind, "aborted_mid_stream": aborted,
                     "errors": len(errors), "http_5xx": http_5xx,
                     "compared_with_ar": sum(1 for r in results if r.ok and r.request.kind in GREEDY_KINDS),
                     "greedy_mismatches": len(mismatches), "bad_samples": len(bad_samples)},
        "latency_s": _latency(results),
        "timings_s": {k: round(v, 1) for k, v in timings.items()},
        "tracebacks": tracebacks, "startup_tracebacks": startup_tracebacks,
        "state_at_probe": state, "slots": slots, "probe_meta_ok": probe.ok,
        "scheduler_rss_mib": {k: round(v, 1) for k, v in rss.items()},
        "rss_growth_after_warmup_mib": round(growth, 1), "rss_bound_mib": args.rss_bound_mib,
        "group_rss_mib_at_end": {str(k): round(v, 1) for k, v in group.items()},
        "failures": failures, "passed": not failures, "logs": str(work),
    }


def _latency(results: list[Result]) -> dict[str, float]:
    done = sorted(r.seconds for r in results
                  if r.ok and r.request.kind != "abort" and r.request.phase == "sequential")
    if not done:
        return {}
    return {"sequential_median": round(done[len(done) // 2], 3), "sequential_max": round(done[-1], 3)}


def format_summary(s: dict) -> str:
    req = s["requests"]
    st = s["state_at_probe"] or {}
    lines = [
        f"load check: {'PASS' if s['passed'] else 'FAIL'} "
        f"({' '.join(filter(None, [s['args']['algorithm'], s['args']['server_args']]))})",
        f"requests: {s['args']['sequential']} sequential + {s['args']['concurrent']} concurrent "
        f"x {s['args']['rounds']} round(s) (+{s['args']['warmup']} warm-up), "
        f"max_new_tokens {s['args']['max_new_tokens']}; "
        f"by kind {req['by_kind_load']}",
        f"aborted mid-stream by the client: {req['aborted_mid_stream']}; errors: {req['errors']} "
        f"(HTTP 5xx: {req['http_5xx']}); log tracebacks after start-up: {s['tracebacks']} "
        f"(during start-up: {s['startup_tracebacks']})",
        f"greedy/regex/streamed outputs equal to AR: {req['compared_with_ar'] - req['greedy_mismatches']}"
        f"/{req['compared_with_ar']}; bad samples: {req['bad_samples']}",
        f"NanoSpec state at the probe: live {st.get('live', 'n/a')}, started {st.get('started')}, slots used "
        f"{st.get('slots_used')} of {s['slots']}, pending prompts {st.get('pending')}, "
        f"state bytes {st.get('bytes')}",
        f"scheduler RSS MiB: {s['scheduler_rss_mib']}; growth after warm-up "
        f"{s['rss_growth_after_warmup_mib']} MiB (bound {s['rss_bound_mib']})",
        f"server process group RSS MiB at the end: {s['group_rss_mib_at_end']}",
        f"latency: {s['latency_s']}; timings s: {s['timings_s']}",
    ]
    lines += [f"FAILED: {f}" for f in s["failures"]]
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sequential", type=int, default=200)
    p.add_argument("--concurrent", type=int, default=50)
    p.add_argument("--algorithm", choices=("NANOSPEC", "EAGLE3", "none"), default="NANOSPEC",
                   help="the server under test (EAGLE3/none: SGLang alone, for comparison)")
    p.add_argument("--server-args", default="", help="extra flags for the server under test")
    p.add_argument("--rounds", type=int, default=1, help="repeat the sequential + concurrent load")
    p.add_argument("--max-new-tokens", type=int, default=16)
    p.add_argument("--rss-bound-mib", type=float, default=64.0)
    p.add_argument("--deadline", type=float, default=1500.0, help="seconds for everything, start-up included")
    p.add_argument("--request-timeout", type=float, default=180.0)
    p.add_argument("--startup-timeout", type=float, default=400.0)
    p.add_argument("--workdir", help="models and server logs (default: a new temporary directory)")
    p.add_argument("--out", help="also write the summary text here")
    p.add_argument("--json", help="write the full result as JSON here")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    summary = check(args)
    text = format_summary(summary)
    print(text)
    if args.out:
        cmd = "python scripts/load_check.py " + " ".join(argv if argv is not None else sys.argv[1:])
        Path(args.out).write_text(f"$ {cmd}\n{text}\n")
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=2))
    return 0 if summary["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
