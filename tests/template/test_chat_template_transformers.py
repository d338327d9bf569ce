"""Parity: our renderer gives the text of transformers' ``apply_chat_template(tokenize=False)``.

transformers (the installed 5.x) loads the real tokenizer folders of tests/data/tokenizers with
``PreTrainedTokenizerFast.from_pretrained`` (local files only); both sides render the folder's
own template with the tokenizer's ``special_tokens_map``.
"""

from __future__ import annotations

import copy

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tokenkeys.errors import InvalidArgument
from tokenkeys.template.render import ChatTemplateRenderer

from chat_fixtures import CHAT_MODELS, TOOL_CONVERSATION, TOOLS
from conformance_data import data_path

MODELS = CHAT_MODELS

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def hf() -> dict:
    return {
        name: transformers.PreTrainedTokenizerFast.from_pretrained(
            str(data_path("tokenizers", name)), local_files_only=True
        )
        for name in MODELS
    }


CONVERSATIONS = {
    "cjk_emoji_accents": [
        {"role": "system", "content": "Tu es un assistant précis. 你是一个助手。"},
        {"role": "user", "content": "日本の首都は？ 🗾 Ça va? naïve café"},
        {"role": "assistant", "content": "東京です。🎌 Très bien!"},
        {"role": "user", "content": "한국어도 돼? 👩‍👩‍👧 ﬁn — Ελληνικά"},
    ],
    "no_system": [
        {"role": "user", "content": "Hello  there,\n\tfriend "},
        {"role": "assistant", "content": " leading and trailing spaces "},
        {"role": "user", "content": "<|im_start|> literal specials <|end|> in text"},
    ],
    "prefill": [
        {"role": "user", "content": "Écris un haïku sur la mer."},
        {"role": "assistant", "content": "Vagues d'argent —"},
    ],
}


def _ours(tok, messages, **kwargs) -> str:
    return ChatTemplateRenderer(tok.chat_template).render(
        messages, special_tokens=tok.special_tokens_map, **kwargs
    )


def _theirs(tok, messages, **kwargs) -> str:
    return tok.apply_chat_template(copy.deepcopy(messages), tokenize=False, **kwargs)


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("conversation", sorted(CONVERSATIONS))
@pytest.mark.parametrize("agp", [False, True])
def test_conversations_match(hf, model, conversation, agp) -> None:
    tok = hf[model]
    messages = CONVERSATIONS[conversation]
    assert _ours(tok, messages, add_generation_prompt=agp) == _theirs(
        tok, messages, add_generation_prompt=agp
    )


@pytest.mark.parametrize("model", MODELS)
def test_continue_final_message_matches(hf, model) -> None:
    tok = hf[model]
    messages = CONVERSATIONS["prefill"]
    ours = _ours(tok, messages, continue_final_message=True)
    assert ours == _theirs(tok, messages, continue_final_message=True)
    assert ours.endswith("Vagues d'argent —")
    full = _ours(tok, messages)
    assert full.startswith(ours) and len(full) > len(ours)


@pytest.mark.parametrize("agp", [False, True])
def test_qwen_tools_and_tool_calls_match(hf, agp) -> None:
    tok = hf["qwen2.5-instruct"]
    ours = _ours(tok, TOOL_CONVERSATION, tools=TOOLS, add_generation_prompt=agp)
    assert ours == _theirs(tok, TOOL_CONVERSATION, tools=TOOLS, add_generation_prompt=agp)
    assert '{"name": "get_weather", "arguments": {"city": "Zürich"}}' in ours
    assert "<tool_response>\n" in ours


def test_qwen_empty_tools_list_is_given(hf) -> None:
    tok = hf["qwen2.5-instruct"]
    messages = CONVERSATIONS["no_system"]
    assert _ours(tok, messages, tools=[]) == _theirs(tok, messages, tools=[])


def test_extra_variables_override_special_tokens(hf) -> None:
    tok = hf["phi-3-mini"]
    messages = CONVERSATIONS["no_system"]
    ours = _ours(tok, messages, variables={"eos_token": "<EOS>"})
    assert ours == _theirs(tok, messages, eos_token="<EOS>")
    assert ours.endswith("<EOS>")


def test_both_refuse_continue_with_generation_prompt(hf) -> None:
    tok = hf["smollm2-135m-instruct"]
    messages = CONVERSATIONS["prefill"]
    with pytest.raises(ValueError):
        _theirs(tok, messages, continue_final_message=True, add_generation_prompt=True)
    with pytest.raises(InvalidArgument):
        _ours(tok, messages, continue_final_message=True, add_generation_prompt=True)


_text = st.text(st.characters(blacklist_categories=("Cs",)), min_size=0, max_size=40).filter(
    lambda s: "CONTINUE_FINAL_MESSAGE_TAG" not in s
)


@st.composite
def _conversation(draw) -> list[dict]:
    turns = draw(st.integers(min_value=1, max_value=5))
    messages = []
    if draw(st.booleans()):
        messages.append({"role": "system", "content": draw(_text)})
    for i in range(turns):
        messages.append({"role": "user" if i % 2 == 0 else "assistant", "content": draw(_text)})
    return messages


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(conversation=_conversation(), agp=st.booleans(), model=st.sampled_from(MODELS))
def test_random_conversations_match(hf, conversation, agp, model) -> None:
    tok = hf[model]
    ours = _ours(tok, conversation, add_generation_prompt=agp)
    assert ours == _theirs(tok, conversation, add_generation_prompt=agp)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(conversation=_conversation(), model=st.sampled_from(MODELS))
def test_random_continue_final_message_matches(hf, conversation, model) -> None:
    tok = hf[model]

    def outcome(render):
        try:
            return render()
        except (ValueError, InvalidArgument):
            return "refused"  # both must refuse, whatever the wording

    ours = outcome(lambda: _ours(tok, conversation, continue_final_message=True))
    theirs = outcome(lambda: _theirs(tok, conversation, continue_final_message=True))
    assert ours == theirs
