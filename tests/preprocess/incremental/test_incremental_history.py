"""Templates that rewrite history are seen, counted per model and logged once."""

from __future__ import annotations

import logging

from tokenkeys.preprocess import Preprocessor
from tokenkeys.preprocess.chat import ChatOptions
from tokenkeys.tokenizer import Tokenizer, default_tokenizer_path

# Like templates that drop earlier reasoning: the first line counts the messages, so every
# turn changes what was rendered before.
REWRITING = (
    "turns={{ messages|length }}\n{% for m in messages %}<|im_start|>{{ m.role }}\n"
    "{{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% endif %}"
)


def _conversation(pre: Preprocessor, turns: int) -> None:
    messages: list[dict] = []
    for turn in range(turns):
        messages.append({"role": "user", "content": f"question {turn}"})
        pre.tokenize_chat({"messages": list(messages)})
        messages.append({"role": "assistant", "content": f"answer {turn}"})


def test_an_extending_template_counts_nothing() -> None:
    pre = Preprocessor(Tokenizer.load(default_tokenizer_path()), model="smol")
    _conversation(pre, 5)
    assert pre.history.rewrites == 0
    assert pre.encoder.stats.hits >= 4  # each turn reused the one before


def test_a_rewriting_template_is_counted_and_logged_once(caplog) -> None:
    tokenizer = Tokenizer.load(default_tokenizer_path())
    pre = Preprocessor(tokenizer, chat_options=ChatOptions(chat_template=REWRITING), model="m1")
    with caplog.at_level(logging.WARNING):
        _conversation(pre, 5)
    assert pre.history.rewrites == 4  # every turn after the first
    lines = [r for r in caplog.records if "rewrote an earlier turn" in r.getMessage()]
    assert len(lines) == 1 and "m1" in lines[0].getMessage()


def test_another_conversation_is_no_rewrite() -> None:
    pre = Preprocessor(Tokenizer.load(default_tokenizer_path()))
    pre.tokenize_chat({"messages": [{"role": "user", "content": "a"}]})
    pre.tokenize_chat({"messages": [{"role": "user", "content": "b"}]})
    edited = [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "x"},
        {"role": "user", "content": "c"},
    ]
    pre.tokenize_chat({"messages": edited})  # extends the first: an extension, no rewrite
    assert pre.history.rewrites == 0
