"""nanospec/draft_format.py: the one EAGLE-3 draft directory format (nanospec.train's export, benchmarks,
fixtures)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file, save_file

from nanospec import draft_format as fmt
from tests.support.tiny_models import make_tiny_eagle3_draft, make_tiny_llama


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("pair")
    target = make_tiny_llama(root / "run" / "target", vocab_size=512)
    return target, make_tiny_eagle3_draft(root / "run" / "final", target)


def test_importable_without_sglang_or_transformers():
    code = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('sglang', 'transformers'):\n"
        "            raise ImportError(name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "from nanospec import draft_format as f\n"
        "assert f.default_aux_layer_ids(32) == [1, 15, 28]\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_save_then_load_round_trips_weights_maps_and_config(tmp_path, pair):
    target, draft = pair
    config, state = fmt.load_draft_dir(draft, target)
    assert config["architectures"] == [fmt.ARCHITECTURE] and config["draft_vocab_size"] == 512
    state = {**state, fmt.D2T: torch.arange(3), fmt.T2D: torch.ones(512, dtype=torch.bool)}
    out = fmt.save_draft_dir(tmp_path / "d", state, config, dtype=torch.bfloat16)
    again_cfg, again = fmt.load_draft_dir(out, target)
    assert again_cfg == {**config, "dtype": "bfloat16", "torch_dtype": "bfloat16"}
    assert again.keys() == state.keys()
    for name, t in state.items():
        want = t.to(torch.bfloat16) if t.is_floating_point() else t  # only floating tensors change dtype
        assert again[name].dtype == want.dtype and torch.equal(again[name], want), name
    text = (out / fmt.CONFIG_NAME).read_text()
    assert text == json.dumps(json.loads(text), indent=2, sort_keys=True) + "\n"


def test_the_trainers_draft_has_exactly_the_formats_weights(pair):
    from transformers import AutoConfig

    from nanospec.train.model import Eagle3Draft, draft_config

    target, _ = pair
    tcfg = AutoConfig.from_pretrained(str(target))
    for tie in (False, True):
        cfg = draft_config(tcfg, None, tie)
        shapes = {k: tuple(v.shape) for k, v in Eagle3Draft(cfg).state_dict().items()}
        assert shapes == fmt.weight_shapes(cfg.to_dict())
        # One derivation: the dict the fixtures write holds what the trainer's LlamaConfig holds.
        plain = fmt.draft_config_dict(json.loads((target / "config.json").read_text()), None, tie)
        assert {k: v for k, v in cfg.to_dict().items() if k in plain} == plain


def test_one_capture_layer_rule_for_trainer_and_fixtures(pair):
    target, draft = pair
    layers = json.loads((target / "config.json").read_text())["num_hidden_layers"]
    ids = json.loads((draft / "config.json").read_text())["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
    assert ids == fmt.default_aux_layer_ids(layers) == [-1, 0, 1]


def test_top_ids_force_eos_then_take_the_most_counted_then_the_lowest_ids():
    counts = torch.tensor([0, 5, 5, 0, 1, 9])
    assert fmt.top_ids(counts, 3, forced=[3]).tolist() == [1, 3, 5]
    assert fmt.top_ids(counts, 2).tolist() == [1, 5]  # 5 and 5 tie: the lower id (1) wins
    assert fmt.top_ids(counts, 5).tolist() == [0, 1, 2, 4, 5]  # unseen 0 before unseen 3
    assert fmt.top_ids(counts, 6, forced=[99]).tolist() == list(range(6))  # out-of-range ids are ignored
    for n in (0, 7):
        with pytest.raises(ValueError, match="1..6"):
            fmt.top_ids(counts, n)


def test_static_top_n_keeps_the_most_counted_rows_with_eos_in_sglangs_format(pair, tmp_path):
    target, draft = pair
    counts = torch.zeros(512, dtype=torch.long)
    counts[[300, 7, 42]] = torch.tensor([3, 2, 2])
    out = fmt.static_top_n(draft, tmp_path / "s", 6, counts)
    w, full = load_file(str(out / fmt.WEIGHTS_NAME)), load_file(str(draft / fmt.WEIGHTS_NAME))
    hot = fmt.target_ids(w[fmt.D2T])
    assert hot.tolist() == [0, 1, 2, 7, 42, 300]  # EOS (1) forced, then 300, 7, 42, then the lowest ids
    assert torch.equal(w[fmt.HEAD], full[fmt.HEAD][hot]) and torch.equal(w["fc.weight"], full["fc.weight"])
    assert w[fmt.T2D].dtype == torch.bool and w[fmt.T2D].sum() == 6 and bool(w[fmt.T2D][hot].all())
    assert json.loads((out / fmt.CONFIG_NAME).read_text())["draft_vocab_size"] == 6
    assert (out / "tokenizer.json").is_file()
    with pytest.raises(fmt.DraftFormatError, match="not a full-vocabulary draft"):
        fmt.static_top_n(out, tmp_path / "again", 4, counts)


def test_token_counts_are_found_in_the_run_directory(pair, tmp_path):
    _, draft = pair
    assert fmt.find_token_counts(draft) is None
    path = draft.parent / fmt.TOKEN_COUNTS_NAME
    save_file({"counts": torch.arange(512)}, str(path))
    try:
        assert fmt.find_token_counts(draft) == path  # RUN/final -> RUN/token_counts.safetensors
        assert fmt.find_token_counts(draft.parent / "checkpoints" / "step_3") == path
        assert torch.equal(fmt.load_token_counts(path), torch.arange(512))
    finally:
        path.unlink()


def test_missing_draft_directory_or_file_is_named(tmp_path, pair):
    with pytest.raises(fmt.DraftFormatError, match=r"nope: no such directory"):
        fmt.load_draft_dir(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(fmt.DraftFormatError, match=r"empty/config.json not found"):
        fmt.check_draft_dir(tmp_path / "empty")
    _, draft = pair
    d = tmp_path / "noweights"
    d.mkdir()
    (d / fmt.CONFIG_NAME).write_text((draft / fmt.CONFIG_NAME).read_text())
    with pytest.raises(fmt.DraftFormatError, match=r"noweights/model.safetensors not found"):
        fmt.load_draft_dir(d)


def test_truncated_safetensors_is_named(tmp_path, pair):
    _, draft = pair
    d = tmp_path / "cut"
    d.mkdir()
    (d / fmt.CONFIG_NAME).write_text((draft / fmt.CONFIG_NAME).read_text())
    data = (draft / fmt.WEIGHTS_NAME).read_bytes()
    (d / fmt.WEIGHTS_NAME).write_bytes(data[: len(data) // 2])
    with pytest.raises(fmt.DraftFormatError, match=r"cut/model.safetensors: not a complete safetensors file"):
        fmt.check_draft_dir(d)
    with pytest.raises(fmt.DraftFormatError, match="truncated or corrupt"):
        fmt.load_draft_dir(d)


def test_a_draft_of_another_target_is_named_with_the_mismatch(tmp_path, pair):
    target, draft = pair
    other_vocab = make_tiny_llama(tmp_path / "v", vocab_size=640)
    with pytest.raises(fmt.DraftFormatError, match=r"final/config.json: .*vocabulary of 512 tokens.*"
                                                   r"vocab_size 640"):
        fmt.load_draft_dir(draft, other_vocab)
    with pytest.raises(fmt.DraftFormatError, match=r"hidden states of size 64.*hidden_size 96"):
        fmt.check_draft_dir(draft, {"vocab_size": 512, "hidden_size": 96})
    fmt.check_draft_dir(draft, target)


def test_a_config_that_is_not_eagle3_or_weights_that_do_not_fit_it_are_named(tmp_path, pair):
    target, draft = pair
    with pytest.raises(fmt.DraftFormatError, match=r"target/config.json: not an EAGLE-3 draft"):
        fmt.load_draft_dir(target)
    config, state = fmt.load_draft_dir(draft)
    bad = fmt.save_draft_dir(tmp_path / "bad", {**state, fmt.HEAD: state[fmt.HEAD][:10]}, config)
    with pytest.raises(fmt.DraftFormatError, match=r"lm_head.weight has shape \(10, 64\).*\(512, 64\)"):
        fmt.load_draft_dir(bad)
