"""train/model.py, train/target.py: feature capture points, TTT causality, checkpoint-format compatibility."""

import pytest
import torch
from transformers import AutoModelForCausalLM

from nanospec.train.export import load_draft, save_draft
from nanospec.train.model import Eagle3Draft, check_aux_layer_ids, default_aux_layer_ids, draft_config
from nanospec.train.target import features
from tests.support.tiny_models import eagle3_reference_step, make_tiny_eagle3_draft, make_tiny_llama


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory):
    return make_tiny_llama(tmp_path_factory.mktemp("t"), layers=4)


def test_default_aux_layers_are_sglangs_capture_points_in_config_convention():
    # SGLang captures the inputs of layers [2, L//2, L-3] by default; config ids are those minus one.
    assert default_aux_layer_ids(32) == [1, 15, 28]
    assert default_aux_layer_ids(30) == [1, 14, 26]
    assert default_aux_layer_ids(3) == [-1, 0, 1]  # [2, 1, 0] in layer order, as SGLang concatenates them
    with pytest.raises(ValueError, match="3 layers"):
        default_aux_layer_ids(2)


@pytest.mark.parametrize("layers", range(3, 41))
def test_default_aux_layers_are_three_states_sglang_captures_as_configured(layers):
    # 4-6 layers: SGLang's own default names a layer twice ([2, 2, 1] for 4), so spaced layers stand in.
    ids = default_aux_layer_ids(layers)
    assert len(ids) == 3 and check_aux_layer_ids(ids, layers) == ids


def test_aux_layer_ids_are_refused_with_the_offending_ids_named():
    assert check_aux_layer_ids([-1, 0, 1], 3) == [-1, 0, 1]
    with pytest.raises(ValueError, match=r"\[0\] more than once.*expect 3 states and get 2"):
        check_aux_layer_ids([-1, 0, 0], 3)
    with pytest.raises(ValueError, match=r"\[5\] out of range for a target with 4 layers"):
        check_aux_layer_ids([0, 1, 5], 4)
    with pytest.raises(ValueError, match=r"not in increasing order.*\[0, 1, 2\]"):
        check_aux_layer_ids([2, 0, 1], None)
    with pytest.raises(ValueError, match="must be integers"):
        check_aux_layer_ids([0, 1.5, 2], None)


def test_features_capture_the_residual_stream_entering_layer_id_plus_one(target_dir):
    model = AutoModelForCausalLM.from_pretrained(str(target_dir)).eval()
    ids = torch.randint(0, 512, (2, 9))
    att = torch.ones_like(ids)
    aux, last = features(model, ids, att, [-1, 0, 2])
    with torch.no_grad():
        hs = model(ids, attention_mask=att, output_hidden_states=True).hidden_states
    h = model.config.hidden_size
    for j, index in enumerate([0, 1, 3]):  # embeddings, output of layer 0, output of layer 2
        torch.testing.assert_close(aux[..., j * h : (j + 1) * h], hs[index])
    torch.testing.assert_close(last, hs[-1])


def test_draft_config_rejects_layers_sglang_cannot_capture(target_dir):
    cfg = AutoModelForCausalLM.from_pretrained(str(target_dir)).config
    with pytest.raises(ValueError, match="out of range"):
        draft_config(cfg, [0, 1, 3], tie_head=False)  # id 3 would be the output of the last layer


def test_ttt_step_k_at_position_i_never_sees_later_tokens_or_features(target_dir):
    cfg = draft_config(AutoModelForCausalLM.from_pretrained(str(target_dir)).config, None, tie_head=False)
    torch.manual_seed(0)
    draft = Eagle3Draft(cfg).eval()
    t, h = 12, cfg.hidden_size
    aux, emb = torch.randn(1, t, 3 * h), torch.randn(1, t, h)
    cut = 8
    aux2, emb2 = aux.clone(), emb.clone()
    aux2[:, cut:] += torch.randn_like(aux2[:, cut:])
    emb2[:, cut:] += torch.randn_like(emb2[:, cut:])

    def outputs(a, e):
        pos = torch.arange(t)[None]
        hidden, cache, outs = draft.fc(a), [], []
        for k in range(4):
            shifted = torch.zeros_like(e)
            shifted[:, : t - 1 - k] = e[:, 1 + k :]
            hidden = draft.step(hidden, shifted, pos + k, cache, k)
            outs.append(hidden)
        return outs

    with torch.no_grad():
        base, changed = outputs(aux, emb), outputs(aux2, emb2)
    for k in range(4):
        safe = cut - 1 - k  # step k at position i reads token i+1+k and features <= i
        torch.testing.assert_close(base[k][:, :safe], changed[k][:, :safe])
        assert not torch.allclose(base[k][:, safe:], changed[k][:, safe:])


def test_load_draft_reads_a_specforge_layout_draft_and_round_trips_through_export(tmp_path):
    target = make_tiny_llama(tmp_path / "t", agree=True)
    ref_dir = make_tiny_eagle3_draft(tmp_path / "d", target, agree=True)
    draft, vocab_map = load_draft(ref_dir)
    assert vocab_map is None
    aux = torch.randn(5, 3 * 64)
    with torch.no_grad():
        # Attention output is zero here: a step is fc -> MLP block -> norm -> head, as in the reference.
        hidden = draft.step(draft.fc(aux)[None], torch.randn(1, 5, 64), torch.arange(5)[None], [], 0)
        ours = draft.logits(hidden[0]).argmax(-1)
    assert torch.equal(ours, eagle3_reference_step(ref_dir, aux))
    again, _ = load_draft(save_draft(draft, tmp_path / "e", dtype=torch.float32))
    for (name, a), (_, b) in zip(draft.state_dict().items(), again.state_dict().items(), strict=True):
        assert torch.equal(a, b), name
