"""The tests' SGLang server launcher, ``SGLangServer``, and ``free_port``: both live in the product's
testing module ``nanospec/testing.py`` (the CPU op benchmarks start their servers with it too); see its
docstring for the API. Typical module-scoped fixture::

    @pytest.fixture(scope="module")
    def server(tmp_path_factory):
        model = make_tiny_llama(tmp_path_factory.mktemp("m"), vocab_size=512)
        with SGLangServer(model, log_path=tmp_path_factory.mktemp("log") / "server.log") as srv:
            yield srv
"""

from nanospec.bench.server import free_port  # noqa: F401  (re-exported)
from nanospec.testing import SGLangServer  # noqa: F401  (re-exported)
