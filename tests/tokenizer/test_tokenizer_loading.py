"""Loading a folder: all or nothing, errors naming the file and the cause; specials resolved."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tokenkeys.errors import TokenizerLoadError
from tokenkeys.tokenizer import Tokenizer, default_tokenizer_path

from conformance_data import data_path


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    dest = tmp_path / "tok"
    shutil.copytree(default_tokenizer_path(), dest)
    return dest


def test_unloadable_tokenizer_names_the_file_and_cause() -> None:
    path = data_path("tokenizers", "llama2-unloadable")
    with pytest.raises(TokenizerLoadError) as info:
        Tokenizer.load(path)
    assert "tokenizer.json" in str(info.value)
    assert "Merges" in str(info.value)


def test_missing_folder(tmp_path: Path) -> None:
    with pytest.raises(TokenizerLoadError, match="not a directory"):
        Tokenizer.load(tmp_path / "nope")


def test_missing_tokenizer_json(folder: Path) -> None:
    (folder / "tokenizer.json").unlink()
    with pytest.raises(TokenizerLoadError, match=r"tokenizer\.json: missing"):
        Tokenizer.load(folder)


def test_invalid_config_json_names_the_file(folder: Path) -> None:
    (folder / "tokenizer_config.json").write_text("{not json")
    with pytest.raises(TokenizerLoadError, match=r"tokenizer_config\.json: not valid UTF-8 JSON"):
        Tokenizer.load(folder)


def test_symlinked_file_is_refused(folder: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside.json"
    outside.write_text("{}")
    (folder / "special_tokens_map.json").symlink_to(outside)
    with pytest.raises(TokenizerLoadError, match="not a regular file"):
        Tokenizer.load(folder)


def test_unknown_special_token_is_refused(folder: Path) -> None:
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["bos_token"] = "<|no-such-token|>"
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(TokenizerLoadError, match="not in the vocabulary"):
        Tokenizer.load(folder)


def test_default_specials() -> None:
    tok = Tokenizer.load(default_tokenizer_path())
    sp = tok.specials
    assert (sp.bos.content, sp.bos.id) == ("<|im_start|>", 1)
    assert [(e.content, e.id) for e in sp.eos] == [("<|im_end|>", 2)]
    assert sp.pad.id == 2 and sp.unk.id == 0
    assert sp.model_max_length == 8192
    assert any(a.content == "<|im_start|>" and a.special for a in sp.added)
    assert "default" in tok.chat_templates
    assert tok.vocab_size == 49152


def test_generation_config_eos_list_is_included(folder: Path) -> None:
    (folder / "generation_config.json").write_text('{"eos_token_id": [2, 0], "bos_token_id": 1}')
    tok = Tokenizer.load(folder)
    assert [e.id for e in tok.specials.eos] == [2, 0]
    assert tok.specials.eos[1].content == "<|endoftext|>"


def test_generation_config_eos_outside_vocab(folder: Path) -> None:
    (folder / "generation_config.json").write_text('{"eos_token_id": 999999}')
    with pytest.raises(TokenizerLoadError, match="generation_config.json"):
        Tokenizer.load(folder)


def test_chat_template_files_replace_config_templates(folder: Path) -> None:
    """transformers 5: chat_template.jinja and additional_chat_templates/ replace the config's."""
    (folder / "chat_template.json").write_text(json.dumps({"chat_template": "json {{ 1 }}"}))
    config_template = Tokenizer.load(folder).chat_templates["default"]
    assert config_template.startswith("{% for message in messages %}")
    (folder / "chat_template.jinja").write_text("jinja {{ 2 }}")
    (folder / "additional_chat_templates").mkdir()
    (folder / "additional_chat_templates" / "tool_use.jinja").write_text("tools {{ 3 }}")
    tok = Tokenizer.load(folder)
    assert tok.chat_templates == {"default": "jinja {{ 2 }}", "tool_use": "tools {{ 3 }}"}
    assert "additional_chat_templates/tool_use.jinja" in {e.path for e in tok.folder.entries}


def test_processor_template_is_the_fallback(folder: Path) -> None:
    """vLLM falls back to chat_template.json only when the tokenizer has no template."""
    config = json.loads((folder / "tokenizer_config.json").read_text())
    del config["chat_template"]
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    assert Tokenizer.load(folder).chat_templates == {}
    (folder / "chat_template.json").write_text(json.dumps({"chat_template": "json {{ 1 }}"}))
    assert Tokenizer.load(folder).chat_templates == {"default": "json {{ 1 }}"}


def test_named_templates_from_config(folder: Path) -> None:
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["chat_template"] = [
        {"name": "default", "template": "a"},
        {"name": "tool_use", "template": "b"},
    ]
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    assert Tokenizer.load(folder).chat_templates == {"default": "a", "tool_use": "b"}
    config["chat_template"] = [{"template": "nameless"}]
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(TokenizerLoadError, match="needs a string 'name'"):
        Tokenizer.load(folder)


def test_token_strs_are_decoded_text() -> None:
    tok = Tokenizer.load(default_tokenizer_path())
    ids = tok.encode(["Hello world"], add_special_tokens=False)[0].ids
    assert tok.token_strs(ids) == ["Hello", " world"]


def test_sentencepiece_token_strs_keep_leading_space() -> None:
    tok = Tokenizer.load(data_path("tokenizers", "phi-3-mini"))
    ids = tok.encode(["Hello world"], add_special_tokens=False)[0].ids
    assert "".join(tok.token_strs(ids)).strip() == "Hello world"
    assert tok.token_strs(ids)[-1] == " world"
