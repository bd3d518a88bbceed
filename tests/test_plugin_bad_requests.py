"""Requests a NANOSPEC server cannot serve are refused with HTTP 400 naming the problem, and the server
keeps serving (issue 14). ``nanospec/sglang/validate.py`` does the checking in the tokenizer process.

The unit tests exercise the validator's plain functions; the server tests send each bad request to a
real NANOSPEC server on the CPU (tiny random target and EAGLE-3 draft), check the status and the message,
then that ``/health`` and a good request still work. Without the validator the first of them (a token id
outside the vocabulary) raises IndexError in SGLang's scheduler and the whole server goes down.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from types import SimpleNamespace

import pytest

from nanospec.sglang import validate
from tests.plugin_support import server, spec_args
from tests.support.tiny_models import make_tiny_eagle3_draft, make_tiny_llama

VOCAB = 512
CONTEXT = 4096  # make_tiny_llama's max_position_embeddings
KNOWN = {"max_new_tokens", "temperature", "top_p", "top_k", "min_p", "frequency_penalty", "presence_penalty",
         "repetition_penalty", "min_new_tokens", "stop_token_ids", "logit_bias", "n", "ignore_eos", "stop"}


# -- the validator's functions ----------------------------------------------------------------------


@pytest.mark.parametrize(("ids", "message"), [
    ([100000000, 5], "outside the vocabulary [0, 512): 100000000"),
    ([3, -1], "outside the vocabulary [0, 512): -1"),
    ([512], "outside the vocabulary [0, 512): 512"),
    ([1, 2.5], "2.5"),
    ([1, True], "True"),
    (list(range(-10, 0)), "-10, -9, -8, -7, -6 and 5 more"),
    ([], "the prompt is empty"),
    (None, "must be a list of token ids"),
    ([1] * CONTEXT, "the prompt has 4096 tokens (+0 reserved); the context length is 4096"),
])
def test_check_prompt_names_what_is_wrong_with_the_prompt(ids, message):
    with pytest.raises(ValueError) as exc:
        validate.check_prompt(ids, vocab_size=VOCAB, context_len=CONTEXT)
    assert message in str(exc.value)


def test_check_prompt_accepts_valid_prompts_and_leaves_long_ones_to_auto_truncation():
    validate.check_prompt([0, 511, 7], vocab_size=VOCAB, context_len=CONTEXT)
    validate.check_prompt([1] * (CONTEXT - 1), vocab_size=VOCAB, context_len=CONTEXT)
    validate.check_prompt([1] * CONTEXT, vocab_size=VOCAB, context_len=CONTEXT, truncate=True)
    with pytest.raises(ValueError, match=r"\(\+2 reserved\)"):
        validate.check_prompt([1] * (CONTEXT - 2), vocab_size=VOCAB, context_len=CONTEXT, reserved=2)


@pytest.mark.parametrize(("params", "message"), [
    ({"foo": 1, "bar": 2}, "unknown sampling parameter(s): bar, foo"),
    ({"frequency_penalty": float("nan")}, "sampling_params.frequency_penalty is not a finite number"),
    ({"temperature": float("inf")}, "sampling_params.temperature is not a finite number"),
    ({"logit_bias": {"5": float("-inf")}}, "sampling_params.logit_bias.5 is not a finite number"),
    ({"max_new_tokens": float("inf")}, "sampling_params.max_new_tokens is not a finite number"),
    ({"max_new_tokens": -1}, "sampling_params.max_new_tokens must be >= 0, got -1"),
    ({"min_new_tokens": -2}, "sampling_params.min_new_tokens must be >= 0, got -2"),
    ({"max_new_tokens": 2.5}, "sampling_params.max_new_tokens must be an integer, got 2.5"),
    ({"top_k": "5"}, "sampling_params.top_k must be an integer, got '5'"),
    ({"top_p": "high"}, "sampling_params.top_p must be a number, got 'high'"),
    ({"stop_token_ids": [3, 100000]},
     "stop_token_ids holds token id(s) outside the vocabulary [0, 512): 100000"),
    ({"stop_token_ids": 7}, "stop_token_ids must be a list of token ids"),
    ({"logit_bias": {"600": 1.0}}, "logit_bias has key(s) outside the vocabulary [0, 512): '600'"),
    ({"logit_bias": {"5": "big"}}, "logit_bias values must be numbers"),
    ("not a dict", "sampling_params must be an object"),
])
def test_check_sampling_params_names_the_bad_parameter(params, message):
    with pytest.raises(ValueError) as exc:
        validate.check_sampling_params(params, vocab_size=VOCAB, known=KNOWN)
    assert message in str(exc.value)


def test_check_sampling_params_accepts_what_sglang_accepts():
    validate.check_sampling_params(None, vocab_size=VOCAB, known=KNOWN)
    good = {"max_new_tokens": 0, "temperature": 0, "top_k": -1, "logit_bias": {"5": -100},
            "stop_token_ids": [1, None], "stop": ["\n"], "n": 1}
    validate.check_sampling_params(good, vocab_size=VOCAB, known=KNOWN)
    fields = validate.sampling_fields()  # SGLang's own list: API and internal fields
    assert {"max_new_tokens", "json_schema", "no_stop_trim", "stop_strs"} <= fields


def test_requests_with_embeddings_or_multimodal_data_skip_the_prompt_id_check():
    params = {"max_new_tokens": 4}
    embeds = SimpleNamespace(sampling_params=params, input_embeds=[[0.0]], contains_mm_input=lambda: False)
    image = SimpleNamespace(sampling_params=params, input_embeds=None, contains_mm_input=lambda: True)
    for obj in (embeds, image):  # placeholder ids beyond the vocabulary are SGLang's to replace
        validate.check_request(obj, [10**9], vocab_size=VOCAB, known=KNOWN)
    with pytest.raises(ValueError, match="unknown"):
        validate.check_request(SimpleNamespace(sampling_params={"nope": 1}, input_embeds=[[0.0]]), None,
                               vocab_size=VOCAB, known=KNOWN)


def test_validation_hook_is_registered_before_sglangs_own_request_checks():
    from sglang.srt.managers.tokenizer_manager import TokenizerManager
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    import nanospec.sglang

    nanospec.sglang.register()
    target = "sglang.srt.managers.tokenizer_manager.TokenizerManager._validate_one_request"
    assert hasattr(TokenizerManager, "_validate_one_request")
    assert (HookType.BEFORE, validate.before_validate_one_request) in [(t, h) for t, h, _ in
                                                                     HookRegistry._hooks[target]]


def test_validation_applies_to_nanospec_servers_only():
    def manager(algo):
        return SimpleNamespace(server_args=SimpleNamespace(speculative_algorithm=algo))

    assert validate.serves_nanospec(manager("NANOSPEC")) and validate.serves_nanospec(manager("nanospec"))
    assert not any(validate.serves_nanospec(manager(a)) for a in (None, "EAGLE3", "EAGLE"))


# -- a real server ----------------------------------------------------------------------------------


INF = "__inf__"  # a JSON number that parses to infinity: 1e999 (NaN has no JSON spelling)


def _body(payload) -> bytes:
    """The JSON text of ``payload`` with every ``INF`` string written as the number 1e999 (-1e999)."""
    return json.dumps(payload).replace(f'"-{INF}"', "-1e999").replace(f'"{INF}"', "1e999").encode()


def _post(srv, path: str, payload) -> tuple[int, str]:
    """(status, body) of a JSON POST."""
    req = urllib.request.Request(srv.base_url + path, data=_body(payload),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def _generate(ids, **sampling):
    return {"input_ids": ids, "sampling_params": {"max_new_tokens": 4, "temperature": 0.0, **sampling}}


BAD = {
    "id_beyond_vocabulary": ("/generate", _generate([100000000, 5]),
                             "outside the vocabulary [0, 512): 100000000"),
    "negative_id": ("/generate", _generate([7, -3]), "outside the vocabulary [0, 512): -3"),
    "id_equal_to_vocab_size": ("/generate", _generate([512]), "outside the vocabulary [0, 512): 512"),
    "empty_input_ids": ("/generate", _generate([]), "input_ids cannot be empty"),  # SGLang's own check
    "prompt_longer_than_context": ("/generate", _generate([5] * (CONTEXT + 10)), "context length"),
    "batch_with_one_bad_prompt": ("/generate", _generate([[1, 2, 3], [4, 100000]]),
                                  "outside the vocabulary [0, 512): 100000"),
    "negative_max_new_tokens": ("/generate", _generate([1, 2], max_new_tokens=-1), "max_new_tokens must be"),
    # /generate's schema check already names an unknown field; the validator covers the other paths.
    "unknown_sampling_key": ("/generate", _generate([1, 2], temprature=0.5), "unknown field `temprature`"),
    # NaN / infinite numbers: SGLang's JSON parser refuses them on every HTTP route before anything else
    # (Python clients write NaN as a bare token; 1e999 parses to infinity). The validator's own check
    # covers what reaches the tokenizer manager without HTTP (the Python Engine API): unit tests above.
    "nan_literal": ("/generate", _generate([1, 2], frequency_penalty=float("nan")), "json_invalid"),
    "infinite_penalty": ("/generate", _generate([1, 2], frequency_penalty=INF), "number is infinity"),
    "infinite_logit_bias": ("/generate", _generate([1, 2], logit_bias={"5": f"-{INF}"}),
                            "number is infinity"),
    "infinite_max_new_tokens": ("/generate", _generate([1, 2], max_new_tokens=INF), "number is infinity"),
    "stop_token_id_beyond_vocabulary": ("/generate",
                                        _generate([1, 2], stop_token_ids=[100000], min_new_tokens=2),
                                        "stop_token_ids holds token id(s) outside the vocabulary"),
    "completions_id_beyond_vocabulary": ("/v1/completions", {"model": "default", "prompt": [100000000, 5],
                                                             "max_tokens": 4}, "outside the vocabulary"),
    "completions_negative_id": ("/v1/completions", {"model": "default", "prompt": [-1], "max_tokens": 4},
                                "outside the vocabulary [0, 512): -1"),
    "completions_infinite_penalty": ("/v1/completions", {"model": "default", "prompt": [1, 2],
                                                         "max_tokens": 4, "presence_penalty": INF},
                                     "number is infinity"),
    "chat_infinite_temperature": ("/v1/chat/completions", {"model": "default", "max_tokens": 4,
                                                           "messages": [{"role": "user", "content": "hi"}],
                                                           "temperature": INF},
                                  "number is infinity"),
    "chat_id_beyond_vocabulary_in_stop_ids": ("/v1/chat/completions", {
        "model": "default", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}],
        "stop_token_ids": [100000], "min_tokens": 2},
        "stop_token_ids holds token id(s) outside the vocabulary"),
    "chat_prompt_longer_than_context": ("/v1/chat/completions", {
        "model": "default", "max_tokens": 4, "messages": [{"role": "user", "content": "hello " * 5000}]},
        "context length"),
}


@pytest.fixture(scope="module")
def nano(tmp_path_factory):
    root = tmp_path_factory.mktemp("bad_requests")
    target = make_tiny_llama(root / "target", vocab_size=VOCAB)
    draft = make_tiny_eagle3_draft(root / "draft", target)
    with server(target, spec_args("NANOSPEC", draft), root, "nanospec") as srv:
        yield srv


def _still_serving(srv) -> None:
    assert urllib.request.urlopen(srv.base_url + "/health", timeout=30).status == 200
    status, body = _post(srv, "/generate", _generate([10, 20, 30]))
    assert status == 200 and len(json.loads(body)["output_ids"]) == 4


@pytest.mark.parametrize("name", list(BAD))
def test_bad_request_is_refused_with_400_naming_the_problem_and_the_server_keeps_serving(nano, name):
    path, payload, message = BAD[name]
    status, body = _post(nano, path, payload)
    assert status == 400, body[:500]
    assert message in body
    _still_serving(nano)


def test_streamed_bad_request_gets_an_error_event_and_the_server_keeps_serving(nano):
    # A streamed response has sent its 200 header before the request is tokenized: the refusal comes as
    # SGLang's error event instead (status code 400 inside), still before the scheduler.
    payload = {**_generate([100000000, 5]), "stream": True}
    status, body = _post(nano, "/generate", payload)
    event = json.loads(body.split("data: ", 1)[1].split("\n", 1)[0])
    assert status == 200 and event["error"]["code"] == 400
    assert "outside the vocabulary" in event["error"]["message"]
    _still_serving(nano)


def test_good_requests_are_unchanged(nano):
    status, body = _post(nano, "/generate", _generate([1, 511, 2], max_new_tokens=6, stop_token_ids=[511],
                                                      logit_bias={"3": 0.5}))
    assert status == 200 and len(json.loads(body)["output_ids"]) <= 6
    status, body = _post(nano, "/v1/completions", {"model": "default", "prompt": [1, 2, 3], "max_tokens": 3})
    assert status == 200 and json.loads(body)["usage"]["completion_tokens"] == 3
