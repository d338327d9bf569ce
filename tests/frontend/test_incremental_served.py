"""The tokenize cache as consumers see it: over real gRPC and HTTP servers on loopback.

Turn after turn of one conversation through /tokenize (chat form) and gRPC Tokenize gives the
ids of a full encode, the later turns reuse the earlier ones (``/metrics``), and both
GetTokenizerInfo and /tokenizer_info say whether the cache is on, and why not when it is off.
"""

from __future__ import annotations

import httpx

from tokenkeys.client import TokenizerClient
from tokenkeys.limits import Limits
from tokenkeys.preprocess.incremental import IncrementalOptions
from tokenkeys.server.runtime.loading import ModelSource, load_models
from tokenkeys.tokenizer import TokenizerOptions

from http_support import HttpServerThread


def _models(options: TokenizerOptions | None = None, incremental: IncrementalOptions | None = None):
    return load_models(
        [ModelSource.default()], options or TokenizerOptions(), Limits(), incremental=incremental
    )


def _metric(text: str, name: str) -> float:
    lines = [line for line in text.splitlines() if line.startswith(name + "{")]
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines)


def test_a_conversation_reuses_its_earlier_turns_and_stays_exact(grpc_server) -> None:
    models = _models(incremental=IncrementalOptions(verify_every=1))
    model = models.get(None)
    messages: list[dict] = [{"role": "system", "content": "Be brief.  12345"}]
    with HttpServerThread(models) as server, httpx.Client(base_url=server.url) as http:
        for turn in range(6):
            messages.append({"role": "user", "content": f"question {turn}\r\n <|im_e"})
            got = http.post("/tokenize", json={"messages": messages}).json()
            prompt = model.preprocessor.chat.render(
                model.preprocessor.chat.prepare({"messages": messages})
            )
            full = model.tokenizer.encode([prompt], add_special_tokens=False)[0].ids
            assert got["tokens"] == full
            messages.append({"role": "assistant", "content": f"answer {turn} ﬁ"})
        scraped = http.get("/metrics").text
        info = http.get("/tokenizer_info").json()["incremental_tokenization"]
    assert _metric(scraped, "tokenkeys_tokenize_cache_hits_total") >= 5
    assert _metric(scraped, "tokenkeys_tokenize_cache_guard_checks_total") >= 5
    assert _metric(scraped, "tokenkeys_tokenize_cache_guard_failures_total") == 0
    assert _metric(scraped, "tokenkeys_tokenize_cache_bytes") > 0
    assert info == {"enabled": True, "reason": "", "max_bytes": 64 << 20, "verify_every": 1}
    text = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    with TokenizerClient(grpc_server(models).target) as client:
        grpc_info = client.info().incremental_tokenization
        for grown in (text, text + "fine<|im_end|>\n"):
            (result,) = client.tokenize([grown], add_special_tokens=True).results
            assert (
                list(result.ids) == model.tokenizer.encode([grown], add_special_tokens=True)[0].ids
            )
    assert grpc_info.enabled and grpc_info.verify_every == 1


def test_a_tokenizer_that_cannot_be_cut_says_why(grpc_server) -> None:
    models = _models(TokenizerOptions(split_special_tokens=True))
    with TokenizerClient(grpc_server(models).target) as client:
        info = client.info().incremental_tokenization
    assert not info.enabled and "split_special_tokens" in info.reason
    with HttpServerThread(models) as server, httpx.Client(base_url=server.url) as http:
        http.post("/tokenize", json={"prompt": "<|im_start|>hi"})
        served = http.get("/tokenizer_info").json()["incremental_tokenization"]
        scraped = http.get("/metrics").text
    assert served["enabled"] is False and served["reason"] == info.reason
    assert (
        'tokenkeys_tokenize_cache_bypasses_total{model="smollm2-135m-instruct",reason="off"}'
        in (scraped)
    )
