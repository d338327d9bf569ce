"""vLLM 0.32's own multimodal processor, run offline by the ENGINE's Python (a script).

Usage: ``python vllm_mm_process.py MODEL_FOLDER CASES.json``; each case is
``{"prompt": text, "images": [{"data": base64 of the file, "uuid": str or null}]}``. The prompt
is encoded by vLLM's tokenizer for the model (no special tokens: the template wrote them), the
images loaded as vLLM loads an image part (``ImageMediaIO().load_bytes``) and the model's
multimodal processor applied (``create_processor(ModelConfig(model=MODEL_FOLDER)).apply``):
the same steps as vLLM's renderer (``_process_multimodal``), without a server and without the
weights. Prints per case ``{"ids", "hashes", "placeholders": [[offset, length], ...]}``.
"""

from __future__ import annotations

import base64
import json
import sys


def main(folder: str, path: str) -> None:
    from vllm.config import ModelConfig
    from vllm.multimodal import MULTIMODAL_REGISTRY
    from vllm.multimodal.media.image import ImageMediaIO
    from vllm.multimodal.processing.context import TimingContext
    from vllm.multimodal.processing.inputs import ProcessorInputs

    processor = MULTIMODAL_REGISTRY.create_processor(ModelConfig(model=folder, tokenizer=folder))
    tokenizer = processor.info.get_tokenizer()
    with open(path, encoding="utf-8") as f:
        cases = json.load(f)
    out = []
    for case in cases:
        ids = tokenizer.encode(case["prompt"], add_special_tokens=False)
        images = [ImageMediaIO().load_bytes(base64.b64decode(i["data"])) for i in case["images"]]
        items = processor.info.parse_mm_data({"image": images})
        uuids = [i.get("uuid") for i in case["images"]]
        uuid_items = {"image": uuids} if any(u is not None for u in uuids) else None
        result = processor.apply(ProcessorInputs(ids, items, uuid_items), TimingContext())
        out.append(
            {
                "ids": list(result["prompt_token_ids"]),
                "hashes": result["mm_hashes"].get("image", []),
                "placeholders": [[p.offset, p.length] for p in result["mm_placeholders"]["image"]],
            }
        )
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
