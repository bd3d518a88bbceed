"""NANOSPEC served by a real SGLang server on the CPU: lossless output, robustness, real clients.

One module-scoped set of servers (plain decoding, NANOSPEC W_max=3072, NANOSPEC W_max=16) on a tiny
random Llama target and a tiny full-vocabulary EAGLE-3 draft, both float32.
"""

from __future__ import annotations

import contextlib
import json
import re
import threading
import time
import urllib.request

import pytest

from tests.plugin_support import PROMPTS, generate_all, last_state, output_ids, server, spec_args
from tests.support.tiny_models import make_tiny_eagle3_draft, make_tiny_llama


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("plugin_models")
    target = make_tiny_llama(root / "target", vocab_size=512)
    draft = make_tiny_eagle3_draft(root / "draft", target)
    return target, draft, tmp_path_factory.mktemp("plugin_logs")


@pytest.fixture(scope="module")
def plain(models):
    target, _, logs = models
    with server(target, [], logs, "plain") as srv:
        yield srv


@pytest.fixture(scope="module")
def nano(models):
    target, draft, logs = models
    # Default W_max. With a 512-token vocabulary the automatic choice would be the plain full head
    # (B * W_max > V), so force the union head here; the W_max=16 and agreeing-draft servers run the
    # automatic choice, which picks the packed head there.
    env = {"NANOSPEC_HEAD": "union"}
    with server(target, spec_args("NANOSPEC", draft), logs, "nanospec", env=env) as srv:
        yield srv


@pytest.fixture(scope="module")
def nano16(models):
    target, draft, logs = models
    env = {"NANOSPEC_W_MAX": "16"}
    with server(target, spec_args("NANOSPEC", draft), logs, "nanospec_w16", env=env) as srv:
        yield srv


@contextlib.contextmanager
def _controller_server(models, name: str, *, steps: int, probe_every: int):
    """A NANOSPEC server on a chain of ``steps`` whose step controller picks from 0..steps in
    batch-size buckets 1, 2 and 4, warming up in one cycle per candidate and probing every
    ``probe_every`` cycles."""
    target, draft, logs = models
    config = logs / f"{name}.json"
    config.write_text(json.dumps({"probe_every": probe_every, "warmup_cycles": 1,
                                  **{str(bs): {"candidate_steps": list(range(steps + 1))}
                                     for bs in (1, 2, 4)}}))
    args = [*spec_args("NANOSPEC", draft), "--speculative-num-steps", str(steps),
            "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", str(steps + 1),
            "--speculative-adaptive-config", str(config)]
    with server(target, args, logs, name) as srv:
        yield srv


def _steps_report(srv) -> dict:
    """The step controller's last ``NANOSPEC steps report`` in the server log."""
    return json.loads(re.findall(r"NANOSPEC steps report: (\{.*\})", srv.log_text())[-1])


@pytest.fixture(scope="module")
def nano_switching(models):
    """The step controller told to probe one step above its choice every other cycle: the step
    count changes between consecutive cycles of the same requests."""
    with _controller_server(models, "nanospec_switching", steps=3, probe_every=1) as srv:
        yield srv


@pytest.fixture(scope="module")
def nano_cold(models):
    """The step controller choosing between 0 and 1 step with a draft that never lands (random
    weights): it settles on plain decoding, so prefills run cold, and it probes 1 step often."""
    with _controller_server(models, "nanospec_cold", steps=1, probe_every=2) as srv:
        yield srv


@pytest.fixture(scope="module")
def reference(plain):
    return [output_ids(r) for r in generate_all(plain, PROMPTS, concurrent=False)]


def _cpu_seconds(srv) -> float:
    """CPU time so far of the server's processes (launcher, scheduler, detokenizer)."""
    import psutil

    root = psutil.Process(srv.process.pid)
    total = 0.0
    for proc in [root, *root.children(recursive=True)]:
        with contextlib.suppress(psutil.Error):
            times = proc.cpu_times()
            total += times.user + times.system
    return total


def test_idle_servers_leave_the_cores_to_the_busy_one(plain, nano, nano16):
    # The module keeps these servers up while it starts more: an idle SGLang scheduler spins a core
    # unless launched with --sleep-on-idle (the tests' launcher adds it), and on a 2-core host two
    # spinning servers starve the start-up of a third past its time-out.
    servers = (plain, nano, nano16)
    before = [_cpu_seconds(s) for s in servers]
    time.sleep(3.0)
    used = [_cpu_seconds(s) - b for s, b in zip(servers, before, strict=True)]
    assert all(u < 0.75 for u in used), used


@pytest.mark.parametrize("concurrent", [False, True], ids=["one_at_a_time", "concurrent"])
def test_greedy_output_equals_plain_decoding(nano, reference, concurrent):
    got = [output_ids(r) for r in generate_all(nano, PROMPTS, concurrent=concurrent)]
    assert got == reference


@pytest.mark.parametrize("concurrent", [False, True], ids=["one_at_a_time", "concurrent"])
def test_greedy_output_equals_plain_decoding_with_w_max_16(nano16, reference, concurrent):
    # Every prompt here is longer than 16 tokens with its top-k: the window evicts at every step.
    got = [output_ids(r) for r in generate_all(nano16, PROMPTS, concurrent=concurrent)]
    assert got == reference
    assert "w_max=16" in nano16.log_text()


@pytest.mark.parametrize("concurrent", [False, True], ids=["one_at_a_time", "concurrent"])
def test_controller_switches_steps_mid_stream_and_output_equals_plain_decoding(nano_switching, reference,
                                                                             concurrent):
    before = nano_switching.log_text().count("Switch adaptive runtime state")
    got = [output_ids(r) for r in generate_all(nano_switching, PROMPTS, concurrent=concurrent)]
    assert got == reference
    log = nano_switching.log_text()
    # 24 new tokens a request (24 cycles of 8 requests when concurrent), a switch about every other
    # cycle: more switches than requests.
    assert log.count("Switch adaptive runtime state") - before >= len(PROMPTS)
    report = _steps_report(nano_switching)
    ran = {int(k) for b in report["buckets"].values() for k, n in b["ran"].items() if n}
    assert ran == {0, 1, 2, 3}
    # 0-step cycles skipped the draft's catch-up pass, and drafting resumed after a cycle that ran it.
    assert report["skipped_catch_up"] > 0 and report["catch_up_cycles"] > 0


@pytest.mark.parametrize("concurrent", [False, True], ids=["one_at_a_time", "concurrent"])
def test_prefills_into_plain_decoding_skip_the_drafts_prefill_and_output_equals_plain_decoding(
        nano_cold, reference, concurrent):
    got = [output_ids(r) for r in generate_all(nano_cold, PROMPTS, concurrent=concurrent)]
    assert got == reference
    report = _steps_report(nano_cold)
    # Cold prefills happened, and 1-step probes drafted after them (from a catch-up cycle's state).
    assert report["cold_prefills"] > 0 and report["catch_up_cycles"] > 0
    assert sum(b["ran"].get("1", 0) for b in report["buckets"].values()) > 0


def test_skipped_catch_up_positions_are_written_before_the_draft_drafts_again(models, reference):
    # One request at a time, so no request joins a batch in the middle of a plain stretch: every
    # skipped position the draft drafts after is written by a widened pass (none is left a hole),
    # and the output stays plain decoding's. A server of its own: its report counts only these.
    with _controller_server(models, "nanospec_gaps", steps=1, probe_every=2) as srv:
        got = [output_ids(r) for r in generate_all(srv, PROMPTS, concurrent=False)]
        report = _steps_report(srv)
    assert got == reference
    fill = report["gap_fill"]
    assert report["skipped_catch_up"] > 0 and report["catch_up_cycles"] > 0
    assert 0 < fill["filled"] <= report["skipped_catch_up"] and fill["holes"] == 0


def test_response_meta_info_reports_active_vocabulary_and_hit_rate(nano16):
    meta = nano16.generate(PROMPTS[2], max_new_tokens=16)["meta_info"]
    assert 0 < meta["nanospec_mean_active_vocab"] <= 16
    assert 0.0 <= meta["nanospec_hit_rate"] <= 1.0
    assert meta["nanospec_draft_steps"] == meta["spec_verify_ct"]


def test_decode_log_line_carries_running_averages(nano):
    nano.generate(PROMPTS[0], max_new_tokens=8)
    lines = [ln for ln in nano.log_text().splitlines() if "accept len" in ln]
    assert lines and "nanospec active vocab" in lines[-1] and "hit rate" in lines[-1]


def test_sampling_at_temperature_one_returns_valid_tokens(nano):
    outs = generate_all(nano, PROMPTS[:4], concurrent=True, temperature=1.0, top_p=0.9, max_new_tokens=16)
    for r in outs:
        ids = output_ids(r)
        assert len(ids) == 16 and all(0 <= t < 512 for t in ids)


def test_one_token_prompt_and_one_token_answer(nano, plain):
    one_token = output_ids(nano.generate([5], max_new_tokens=8))
    assert one_token == output_ids(plain.generate([5], max_new_tokens=8))
    one = nano.generate(PROMPTS[1], max_new_tokens=1)
    assert len(output_ids(one)) == 1
    assert output_ids(one) == output_ids(plain.generate(PROMPTS[1], max_new_tokens=1))


def test_prompt_longer_than_w_max_and_than_a_prefill_chunk(nano16, plain):
    long_prompt = " ".join(PROMPTS) * 3  # a few hundred tokens, far above W_max = 16
    assert output_ids(nano16.generate(long_prompt, max_new_tokens=12)) == output_ids(
        plain.generate(long_prompt, max_new_tokens=12))


def _stream_then_disconnect(srv, prompt: str, chunks: int) -> int:
    payload = {"text": prompt, "stream": True,
               "sampling_params": {"temperature": 0.0, "max_new_tokens": 400, "ignore_eos": True}}
    req = urllib.request.Request(srv.base_url + "/generate", data=json.dumps(payload).encode(),
                                 headers={"Content-Type": "application/json"})
    seen = 0
    with urllib.request.urlopen(req, timeout=120) as resp:
        for line in resp:
            if line.startswith(b"data:"):
                seen += 1
                if seen >= chunks:
                    break  # closing the connection mid-stream aborts the request
    return seen


def test_client_disconnects_and_aborts_leave_the_server_healthy(nano, plain, reference):
    for i in range(3):
        assert _stream_then_disconnect(nano, PROMPTS[i], chunks=3) == 3
    rid = "nanospec-abort-test"
    done = {}

    def long_request():
        done["resp"] = nano.post("/generate", {
            "text": PROMPTS[4], "rid": rid, "sampling_params": {"max_new_tokens": 1500, "ignore_eos": True}})

    t = threading.Thread(target=long_request)
    t.start()
    time.sleep(2.0)
    abort = urllib.request.Request(nano.base_url + "/abort_request", data=json.dumps({"rid": rid}).encode(),
                                   headers={"Content-Type": "application/json"})
    urllib.request.urlopen(abort, timeout=60).read()  # answers with an empty body
    t.join(timeout=300)
    assert done["resp"]["meta_info"]["finish_reason"]["type"] == "abort"
    assert [output_ids(r) for r in generate_all(nano, PROMPTS, concurrent=True)] == reference


def test_many_requests_reuse_slots_without_growing_state(nano):
    first = None
    for i in range(60):  # with the burst below, over twice the server's slots
        r = nano.generate(PROMPTS[i % len(PROMPTS)] + f" {i}", max_new_tokens=3)
        assert len(output_ids(r)) == 3
        if i == 9:
            first = last_state(nano.log_text())
    generate_all(nano, [f"{p} again {j}" for j in range(7) for p in PROMPTS][:50], concurrent=True,
                 max_new_tokens=4)
    nano.generate(PROMPTS[0], max_new_tokens=6)  # one more decode log line after the burst
    state = last_state(nano.log_text())
    assert first is not None and state is not None
    assert state["bytes"] == first["bytes"]  # fixed-size state: no growth with traffic
    assert state["started"] >= 110
    slots = int(re.search(r"; (\d+) slots, vocabulary state", nano.log_text()).group(1))
    assert state["slots_used"] < slots < state["started"]  # 110+ requests in fewer slots: reused
    assert state["live"] <= 1 and state["pending"] <= 1


def test_openai_client_chat_completion(nano, plain):
    openai = pytest.importorskip("openai")
    msgs = [{"role": "user", "content": "Explain how a hash table works."}]

    def ask(srv):
        client = openai.OpenAI(base_url=srv.base_url + "/v1", api_key="none")
        out = client.chat.completions.create(model="default", messages=msgs, max_tokens=16, temperature=0)
        return out.choices[0].message.content

    answer = ask(nano)
    assert isinstance(answer, str) and answer == ask(plain)


def test_sglang_frontend_program_with_gen(nano, plain):
    import sglang as sgl

    @sgl.function
    def program(s, topic):
        s += "A sentence about " + topic + ":"
        s += sgl.gen("answer", max_tokens=12, temperature=0)

    results = []
    for srv in (nano, plain):
        state = program.run(topic="robots", backend=sgl.RuntimeEndpoint(srv.base_url))
        results.append(state["answer"])
    assert isinstance(results[0], str) and results[0] == results[1]
