"""Build a tiny random-weight Llama (and a LoRA adapter for it), or a tiny hybrid Gemma 3; run
by the ENGINE's Python.

Usage: ``python build_tiny_model.py TOKENIZER_FOLDER MODEL_OUT [LORA_OUT [HYBRID_OUT]]``,
``python build_tiny_model.py --vlm SMOLVLM_TOKENIZER_FOLDER VLM_OUT`` for a tiny Idefics3
(``--vlm-config``: its configs only, no weights), or
``python build_tiny_model.py --hybrid WINDOW LAYERS TOKENIZER_FOLDER MODEL_OUT`` for a Gemma 3
text model whose layers follow LAYERS (``s`` a sliding-window layer of WINDOW tokens, ``f`` a
full-attention one, e.g. ``sfsf``): vLLM keeps one KV-cache group per attention kind.
HYBRID_OUT gets one folder per hybrid layout the real-engine tests serve (:data:`HYBRIDS`,
named ``WINDOW-LAYERS``, and the linear-attention Qwen3-Next :data:`LINEAR`), built in the same
process (importing torch is most of the cost).

Nothing is downloaded: the tokenizer files are copied byte for byte from the given folder (the
embedded SmolLM2 tokenizer), so vLLM serves the very files tokenkeys fingerprints. The weights are
random (fixed seed); only the tokenizer, the block hashes and the events matter to the tests.
Shape: vLLM's CPU attention needs a head size of at least 32, hence hidden 128 with 4 heads.

This file imports torch, transformers and peft, which live in the engine environment only; it is
a script, not a test module.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
#: A VLM's folder also carries its processor's settings (the image placeholder expansion).
PROCESSOR_FILES = ("processor_config.json", "preprocessor_config.json")
MAX_POSITIONS = 4096
#: The hybrids the tests serve (vLLM 0.32 keeps one group per kind and layer count, all of
#: 32-token blocks): 4 layers alternating a 64-token window and full attention (group 0 sliding
#: window, group 1 full attention), and 6 layers, full first, two of a 32-token window per full
#: one (group 0 full attention, groups 1 and 2 sliding window: vLLM splits the four window
#: layers into two groups the size of the full one).
HYBRIDS = ((64, "sfsf"), (32, "fssfss"))
#: The linear-attention hybrid (a Qwen3-Next: gated delta net layers ``l`` beside full
#: attention ``f``), built into HYBRID_OUT/LINEAR; vLLM keeps it as a ``mamba`` group.
LINEAR = "gdn-lflf"


def copy_tokenizer(tokenizer_folder: Path, out: Path) -> None:
    """The tokenizer files, byte for byte, beside a model's weights."""
    for name in TOKENIZER_FILES:
        if (tokenizer_folder / name).is_file():
            shutil.copyfile(tokenizer_folder / name, out / name)


def build_vlm(tokenizer_folder: Path, out: Path, weights: bool = True) -> None:
    """A tiny random Idefics3 (SmolVLM layout) over a SmolVLM-layout tokenizer folder.

    The folder (``tests/smolvlm_folder.py``: SmolLM2's tokenizer with SmolVLM's added tokens,
    template and 64-pixel tile settings) is copied byte for byte. The vision tower sees 64-pixel
    tiles in 8-pixel patches: 64 patches, 16 after the connector's pixel shuffle (scale factor
    2), the ``image_seq_len`` of the processor config. Heads of 32 dimensions, as vLLM's CPU
    attention needs. Without ``weights`` only the configs are written: enough for vLLM's
    multimodal processor, which reads the model's config and never its weights.
    """
    from transformers import AutoTokenizer, Idefics3Config

    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_folder), local_files_only=True)
    text = {
        "model_type": "llama",
        "vocab_size": len(tokenizer),
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "max_position_embeddings": MAX_POSITIONS,
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
        "tie_word_embeddings": False,
    }
    vision = {
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "image_size": 64,
        "patch_size": 8,
    }
    config = Idefics3Config(
        text_config=text,
        vision_config=vision,
        scale_factor=2,
        image_token_id=tokenizer.convert_tokens_to_ids("<image>"),
        pad_token_id=tokenizer.pad_token_id,
        torch_dtype="float32",
    )
    if weights:
        import torch
        from transformers import Idefics3ForConditionalGeneration

        torch.manual_seed(0)
        Idefics3ForConditionalGeneration(config).save_pretrained(str(out))
    else:
        out.mkdir(parents=True, exist_ok=True)
        config.save_pretrained(str(out))
    copy_tokenizer(tokenizer_folder, out)
    for name in PROCESSOR_FILES:
        shutil.copyfile(tokenizer_folder / name, out / name)


def build_model(tokenizer_folder: Path, out: Path) -> None:
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_folder), local_files_only=True)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=MAX_POSITIONS,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=True,
        torch_dtype="float32",
    )
    LlamaForCausalLM(config).save_pretrained(str(out))
    copy_tokenizer(tokenizer_folder, out)


def build_hybrid(tokenizer_folder: Path, out: Path, window: int, layers: str) -> None:
    import torch
    from transformers import AutoTokenizer, Gemma3ForCausalLM, Gemma3TextConfig

    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_folder), local_files_only=True)
    kinds = {"s": "sliding_attention", "f": "full_attention"}
    config = Gemma3TextConfig(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=len(layers),
        num_attention_heads=4,
        num_key_value_heads=4,
        head_dim=32,
        query_pre_attn_scalar=32,
        max_position_embeddings=MAX_POSITIONS,
        sliding_window=window,
        layer_types=[kinds[c] for c in layers],
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=True,
        torch_dtype="float32",
    )
    Gemma3ForCausalLM(config).save_pretrained(str(out))
    copy_tokenizer(tokenizer_folder, out)


def build_linear(tokenizer_folder: Path, out: Path) -> None:
    """A tiny Qwen3-Next (4 layers: linear attention, full, linear, full; 4 tiny experts).

    vLLM 0.32's CPU gated-delta-net kernel takes linear-attention heads of 128 dimensions only
    (``chunk_gated_delta_rule_cpu``: "Unexpected head dim size, 32"), hence 2 heads of 128.
    """
    import torch
    from transformers import AutoTokenizer, Qwen3NextConfig, Qwen3NextForCausalLM

    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_folder), local_files_only=True)
    kinds = {"l": "linear_attention", "f": "full_attention"}
    config = Qwen3NextConfig(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=4,
        head_dim=32,
        max_position_embeddings=MAX_POSITIONS,
        layer_types=[kinds[c] for c in LINEAR.split("-")[1]],
        linear_num_value_heads=2,
        linear_num_key_heads=2,
        linear_key_head_dim=128,
        linear_value_head_dim=128,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=64,
        shared_expert_intermediate_size=64,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=True,
        torch_dtype="float32",
    )
    Qwen3NextForCausalLM(config).save_pretrained(str(out))
    copy_tokenizer(tokenizer_folder, out)


def build_lora(model: Path, out: Path) -> None:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaForCausalLM

    torch.manual_seed(1)
    base = LlamaForCausalLM.from_pretrained(str(model))
    # init_lora_weights=False: random A and B, so the adapter really changes the model.
    config = LoraConfig(
        r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], init_lora_weights=False
    )
    get_peft_model(base, config).save_pretrained(str(out))


def main(argv: list[str]) -> None:
    if argv[0] == "--hybrid":
        build_hybrid(Path(argv[3]), Path(argv[4]), int(argv[1]), argv[2])
        return
    if argv[0] in ("--vlm", "--vlm-config"):
        build_vlm(Path(argv[1]), Path(argv[2]), weights=argv[0] == "--vlm")
        return
    tokenizer_folder, model_out = Path(argv[0]), Path(argv[1])
    build_model(tokenizer_folder, model_out)
    if len(argv) > 2:
        build_lora(model_out, Path(argv[2]))
    if len(argv) > 3:
        for window, layers in HYBRIDS:
            build_hybrid(tokenizer_folder, Path(argv[3]) / f"{window}-{layers}", window, layers)
        build_linear(tokenizer_folder, Path(argv[3]) / LINEAR)


if __name__ == "__main__":
    main(sys.argv[1:])
