"""Invalid NANOSPEC settings stop the server at launch with an error naming the setting."""

from __future__ import annotations

import pytest

from tests.plugin_support import server, spec_args
from tests.support.tiny_models import make_tiny_eagle3_draft, make_tiny_llama


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("settings_models")
    target = make_tiny_llama(root / "target", vocab_size=512)
    return target, make_tiny_eagle3_draft(root / "draft", target), tmp_path_factory.mktemp("settings_logs")


@pytest.mark.parametrize("env, message", [
    ({"NANOSPEC_W_MAX": "0"}, "NanoSpecConfig.w_max must be a positive integer, got 0"),
    ({"NANOSPEC_K_VER": "1000"}, "NANOSPEC k_ver=1000 exceeds the vocabulary size 512"),
], ids=["w_max_zero", "k_ver_above_vocabulary"])
def test_invalid_settings_refuse_to_start(models, env, message):
    target, draft, logs = models
    name = next(iter(env)).lower()
    srv = server(target, spec_args("NANOSPEC", draft), logs, name, env=env)
    srv.startup_timeout = 240
    with pytest.raises(RuntimeError, match="exited"):
        srv.start()
    assert message in srv.log_text()
