"""Launch flags that would trace or capture NanoSpec's hooks stop a NANOSPEC server at start-up with an
error naming the flag (``nanospec/sglang/flags.py``); other algorithms keep them.

The flags are parsed by SGLang's own command-line parser, as ``python -m sglang.launch_server`` parses
them; one real server launch checks that the refusal stops the launch before any model loads.
"""

from __future__ import annotations

import argparse

import pytest

from nanospec.sglang import flags
from tests.plugin_support import server, spec_args
from tests.support.tiny_models import make_tiny_eagle3_draft, make_tiny_llama

REFUSED = [
    (["--enable-torch-compile"], "--enable-torch-compile"),
    (["--cuda-graph-backend-prefill", "full"], "--cuda-graph-backend-prefill full"),
    (["--cuda-graph-config", '{"prefill": {"backend": "full"}}'],
     "--cuda-graph-config (prefill.backend) full"),
]


def _args(extra: list[str]):
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    return parser.parse_args(["--model-path", "m", *extra])


@pytest.mark.parametrize("extra, named", REFUSED, ids=["torch_compile", "full_prefill_graph",
                                                       "full_prefill_graph_json"])
def test_flags_that_capture_the_hooks_are_refused_by_name(extra, named):
    with pytest.raises(ValueError, match="NANOSPEC does not support") as e:
        flags.check_flags(_args(extra))
    assert named in str(e.value)


@pytest.mark.parametrize("extra", [[], ["--cuda-graph-backend-prefill", "breakable"],
                                   ["--disable-prefill-cuda-graph"], ["--cuda-graph-backend-decode", "full"]],
                         ids=["defaults", "breakable_prefill_graph", "no_prefill_graph", "full_decode_graph"])
def test_supported_graph_settings_pass(extra):
    assert flags.refused_flags(_args(extra)) == []


def test_validate_server_args_refuses_torch_compile_before_anything_loads(tmp_path):
    from nanospec.sglang.algo import validate_server_args

    target = make_tiny_llama(tmp_path / "target", vocab_size=512)
    draft = make_tiny_eagle3_draft(tmp_path / "draft", target)
    args = _args(["--enable-torch-compile", *spec_args("NANOSPEC", draft)])
    args.model_path = str(target)
    with pytest.raises(ValueError, match="--enable-torch-compile"):
        validate_server_args(args)


def test_a_server_launched_with_torch_compile_exits_naming_the_flag(tmp_path):
    target = make_tiny_llama(tmp_path / "target", vocab_size=512)
    draft = make_tiny_eagle3_draft(tmp_path / "draft", target)
    srv = server(target, [*spec_args("NANOSPEC", draft), "--enable-torch-compile"], tmp_path, "torch_compile")
    srv.startup_timeout = 240
    with pytest.raises(RuntimeError, match="exited"):
        srv.start()
    assert "NANOSPEC does not support --enable-torch-compile" in srv.log_text()
