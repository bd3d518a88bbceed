"""A draft trained by train/eagle3.py loads in SGLang 0.5.23 (CPU) with EAGLE3, and SGLang accepts its tokens.

The agreeing tiny target continues every prompt with t+1, t+2, ... (tests/support/tiny_models.py). The draft
is trained on the target's own continuations (pre-tokenized records, as with target-regenerated data),
exported to OUTPUT/final/ and served as is. A draft that learnt the target, with features and steps as SGLang
computes them, gets every drafted token accepted: the accept length reaches num_steps + 1.
"""

import json
import random

import pytest
import torch

from nanospec.train.eagle3 import main as train_main
from tests.support.sglang_server import SGLangServer
from tests.support.tiny_models import agree_next_token, make_tiny_llama

pytest.importorskip("sglang")

V, STEPS, MAX_NEW = 512, 3, 24
PROMPTS = [[10, 20, 30], [400, 401], [7]]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("train_sglang")
    target = make_tiny_llama(root / "target", vocab_size=V, agree=True)
    rng = random.Random(0)
    records = []
    for _ in range(100):
        prompt = [rng.randrange(6, V) for _ in range(rng.randrange(1, 5))]
        reply = [agree_next_token(prompt[-1] + j, V) for j in range(32)]
        records.append({"input_ids": prompt + reply, "loss_mask": [0] * len(prompt) + [1] * len(reply)})
    (root / "data.json").write_text(json.dumps(records))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        final = train_main(
            [
                "--target-model-path",
                str(target),
                "--data-path",
                str(root / "data.json"),
                "--output-dir",
                str(root / "run"),
                "--max-steps",
                "150",
                "--ttt-steps",
                str(STEPS),
                "--batch-size",
                "4",
                "--lr",
                "3e-3",
                "--save-every",
                "0",
                "--log-every",
                "10",
            ]
        )
    finally:
        torch.set_num_threads(threads)
    args = [
        "--dtype",
        "float32",
        "--speculative-algorithm",
        "EAGLE3",
        "--speculative-draft-model-path",
        str(final),
        "--speculative-num-steps",
        str(STEPS),
        "--speculative-eagle-topk",
        "1",
        "--speculative-num-draft-tokens",
        str(STEPS + 1),
    ]
    with SGLangServer(target, args=args, log_path=root / "server.log") as srv:
        yield srv


def test_exported_draft_serves_with_eagle3_exact_output_and_full_acceptance(server):
    for prompt in PROMPTS:
        res = server.post(
            "/generate",
            {
                "input_ids": prompt,
                "sampling_params": {"temperature": 0.0, "max_new_tokens": MAX_NEW, "ignore_eos": True},
            },
        )
        expected, t = [], prompt[-1]
        for _ in range(MAX_NEW):
            t = agree_next_token(t, V)
            expected.append(t)
        assert res["output_ids"] == expected  # speculative decoding stays lossless
        assert res["meta_info"]["spec_accept_length"] > STEPS, res["meta_info"]
