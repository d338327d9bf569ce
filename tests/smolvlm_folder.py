"""A SmolVLM-layout tokenizer folder built offline from the embedded SmolLM2 tokenizer.

The layout field.md measured against vLLM 0.32: SmolLM2's tokenizer plus SmolVLM's added tokens
(``<fake_token_around_image>``, ``<image>``, ``<end_of_utterance>`` as special tokens,
``<global-img>`` and the ``<row_R_col_C>`` grid tokens), SmolVLM's chat template, and tiny
processor settings (64-pixel tiles, long edge 256, 16 image tokens per tile): a 64x64 image is a
4x4+1 grid, 272 image tokens. Shared by the unit tests and the real-engine build.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from tokenizers import AddedToken
from tokenizers import Tokenizer as HFTokenizer

from tokenkeys.tokenizer.embedded import default_tokenizer_path

SPECIAL = ("<fake_token_around_image>", "<image>", "<end_of_utterance>")
PLAIN = ("<global-img>", *(f"<row_{r}_col_{c}>" for r in range(1, 7) for c in range(1, 7)))
# SmolVLM-Instruct's chat template (HuggingFaceTB/SmolVLM-256M-Instruct, Apache-2.0).
CHAT_TEMPLATE = (
    "<|im_start|>{% for message in messages %}{{message['role'] | capitalize}}"
    "{% if message['content'][0]['type'] == 'image' %}{{':'}}{% else %}{{': '}}{% endif %}"
    "{% for line in message['content'] %}{% if line['type'] == 'text' %}{{line['text']}}"
    "{% elif line['type'] == 'image' %}{{ '<image>' }}{% endif %}{% endfor %}"
    "<end_of_utterance>\n{% endfor %}{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}"
)
IMAGE_SEQ_LEN = 16
PREPROCESSOR = {
    "processor_class": "Idefics3Processor",
    "image_processor_type": "Idefics3ImageProcessor",
    "do_convert_rgb": True,
    "do_image_splitting": True,
    "do_normalize": True,
    "do_pad": True,
    "do_rescale": True,
    "do_resize": True,
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
    "max_image_size": {"longest_edge": 64},
    "resample": 1,
    "rescale_factor": 1 / 255,
    "size": {"longest_edge": 256},
}


def build_smolvlm_folder(out: Path) -> Path:
    """Write the folder into ``out`` (created) and return it."""
    out.mkdir(parents=True, exist_ok=True)
    source = default_tokenizer_path()
    tokenizer = HFTokenizer.from_file(str(source / "tokenizer.json"))
    tokenizer.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in SPECIAL])
    tokenizer.add_tokens([AddedToken(t, normalized=False, special=False) for t in PLAIN])
    tokenizer.save(str(out / "tokenizer.json"))
    config = json.loads((source / "tokenizer_config.json").read_text(encoding="utf-8"))
    config.pop("added_tokens_decoder", None)
    config.pop("_provenance", None)
    config["additional_special_tokens"] = [*config["additional_special_tokens"], *SPECIAL]
    config["chat_template"] = CHAT_TEMPLATE
    config["vocab_size"] = tokenizer.get_vocab_size()
    config["processor_class"] = "Idefics3Processor"
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=1), encoding="utf-8")
    processor = {"processor_class": "Idefics3Processor", "image_seq_len": IMAGE_SEQ_LEN}
    (out / "processor_config.json").write_text(json.dumps(processor), encoding="utf-8")
    (out / "preprocessor_config.json").write_text(json.dumps(PREPROCESSOR), encoding="utf-8")
    if (source / "NOTICE").is_file():
        shutil.copyfile(source / "NOTICE", out / "NOTICE")
    return out
