"""What generation honours: engine parameters from a request, and the one 501 rule."""

from __future__ import annotations

import pytest

from tokenkeys.errors import InvalidArgument
from tokenkeys.frontend.sampling import sampling_of, unsupported_option

EOS = (0, 2)


def test_defaults() -> None:
    s = sampling_of({}, EOS)
    assert s.params.max_tokens == 16 and s.params.seed is None
    assert s.params.stop_token_ids == EOS
    assert s.skip_special_tokens and not s.stream and not s.include_usage


def test_chat_without_max_tokens_gets_the_engines_default_and_knobs_are_carried() -> None:
    request = {"messages": [], "temperature": 0.0, "top_k": 5, "repetition_penalty": 1.1}
    s = sampling_of(request, EOS)
    assert s.params.max_tokens is None  # vLLM fills the context; the simulated engine: 16
    assert s.params.sampling() == {"temperature": 0.0, "top_k": 5, "repetition_penalty": 1.1}


def test_max_completion_tokens_wins_and_stop_ids_merge() -> None:
    request = {"max_tokens": 9, "max_completion_tokens": 3, "stop_token_ids": [5, 2], "seed": -1}
    s = sampling_of(request, EOS)
    assert s.params.max_tokens == 3 and s.params.seed == -1
    assert s.params.stop_token_ids == (5, 2, 0)


def test_ignore_eos_keeps_only_the_request_stop_ids() -> None:
    s = sampling_of({"ignore_eos": True, "stop_token_ids": [7]}, EOS)
    assert s.params.stop_token_ids == (7,)


def test_stream_options() -> None:
    s = sampling_of({"stream": True, "stream_options": {"include_usage": True}}, EOS)
    assert s.stream and s.include_usage


def test_seed_is_a_signed_64_bit_integer() -> None:
    with pytest.raises(InvalidArgument, match="seed"):
        sampling_of({"seed": 2**63}, EOS)


@pytest.mark.parametrize(
    "request_,field",
    [
        ({"n": 2}, "n"),
        ({"logprobs": 0}, "logprobs"),
        ({"echo": True}, "echo"),
        ({"stop": "x"}, "stop"),
        ({"response_format": {"type": "json_schema"}}, "response_format"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"guided_json": {}}, "guided_json"),
        ({"spaces_between_special_tokens": False}, "spaces_between_special_tokens"),
        ({"modalities": ["text", "audio"]}, "modalities"),
        ({"stream_options": {"continuous_usage_stats": True}}, "stream_options"),
    ],
)
def test_refused(request_, field) -> None:
    found = unsupported_option(request_)
    assert found is not None and found[0] == field and "not supported" in found[1]


@pytest.mark.parametrize(
    "request_",
    [
        {},
        {"n": 1, "best_of": None, "logprobs": None, "echo": False, "stop": [], "min_tokens": 0},
        {"response_format": {"type": "text"}, "tool_choice": "auto", "modalities": ["text"]},
        {"logit_bias": {}, "spaces_between_special_tokens": True, "temperature": 2.0},
    ],
)
def test_accepted(request_) -> None:
    assert unsupported_option(request_) is None
