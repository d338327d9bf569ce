"""The package as a user gets it, in fresh virtualenvs: no checkout, no step after ``pip install``.

``python -m build`` makes an sdist and, from that sdist, the wheel (so the sdist is proven
complete); ``pip install '<wheel>[smg]'`` into a fresh virtualenv then runs ``tokenkeys serve
--vllm-engine-face``, which answers smg's VllmEngine calls over real gRPC; an editable install of
the checkout with the same extra (``pip install -e '.[smg]'``) does too.

Cost, kept low: the build runs in a cached environment holding ``build`` and exactly the
``[build-system]`` requirements (``python -m build --no-isolation``: the same build as an
isolated one, without two throwaway build environments per run); the virtualenv is made once for
the module with pip's ``--no-compile`` (the same files; bytecode is written when first imported),
and the editable install reuses it (its dependencies are already there). pip reaches
the configured index; when it cannot, the tests skip naming the failing step (fail under CI,
tests/evidence.py).
"""

from __future__ import annotations

import json
import re
import subprocess
import tarfile
import zipfile
from pathlib import Path

import grpc
import pytest
from evidence import unavailable
from served import Served

from cached_venv import PipInstall, VenvRecipe, VenvUnavailable, ensure_venv
from smg_stubs import require_smg_stubs
from support import REPO

require_smg_stubs()

from tokenkeys.server.grpc.vllm_engine.stubs import (  # noqa: E402
    vllm_engine_pb2 as pb,
)
from tokenkeys.server.grpc.vllm_engine.stubs import (  # noqa: E402
    vllm_engine_pb2_grpc,
)

pytestmark = pytest.mark.package

# pyproject.toml by pattern: tomllib is Python 3.11's, the project runs on 3.10 too.
_PYPROJECT = (REPO / "pyproject.toml").read_text(encoding="utf-8")
VERSION = re.search(r'^version = "([^"]+)"$', _PYPROJECT, re.M).group(1)
_BUILD_REQUIRES = json.loads(re.search(r"^requires = (\[.*\])$", _PYPROJECT, re.M).group(1))
#: The build tool and the project's own build requirements, nothing else.
BUILD_TOOL = VenvRecipe("tokenkeys-build", steps=(PipInstall(("build>=1.2", *_BUILD_REQUIRES)),))


def _environment(recipe: VenvRecipe, root: Path | None = None) -> Path:
    try:
        return ensure_venv(recipe, root)
    except VenvUnavailable as exc:
        unavailable(str(exc))


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder ``python -m build`` wrote the sdist and the wheel into."""
    python = _environment(BUILD_TOOL)
    out = tmp_path_factory.mktemp("dist")
    done = subprocess.run(
        [str(python), "-m", "build", "--no-isolation", "--outdir", str(out), str(REPO)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return out


def _wheel(dist: Path) -> Path:
    """The one wheel built: ``py3-none-any`` without a compiler, else tagged for this platform,
    since it then holds the compiled key core and index table (setup.py's optional extensions)."""
    (wheel,) = dist.glob(f"tokenkeys-{VERSION}-*.whl")
    return wheel


@pytest.fixture(scope="module")
def venv(dist: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtualenv holding the built wheel with its ``smg`` extra; its ``bin`` folder."""
    wheel = _wheel(dist)
    recipe = VenvRecipe("tokenkeys-wheel", steps=(PipInstall(("--no-compile", f"{wheel}[smg]")),))
    return _environment(recipe, tmp_path_factory.mktemp("venv")).parent


def test_build_makes_an_sdist_and_a_wheel_holding_what_serving_reads(dist: Path) -> None:
    wheel_path = _wheel(dist)
    assert sorted(p.name for p in dist.iterdir()) == sorted(
        [wheel_path.name, f"tokenkeys-{VERSION}.tar.gz"]
    )
    with zipfile.ZipFile(wheel_path) as wheel:
        names = set(wheel.namelist())
        metadata = wheel.read(f"tokenkeys-{VERSION}.dist-info/METADATA").decode()
        entry_points = wheel.read(f"tokenkeys-{VERSION}.dist-info/entry_points.txt").decode()
    # The embedded default tokenizer and the generated OpenEngine code ship in the wheel.
    assert "tokenkeys/data/smollm2-135m-instruct/tokenizer.json" in names
    assert "tokenkeys/_gen/openengine/v1/tokenizer_pb2_grpc.py" in names
    # Built with the machine's compiler: the compiled key core and index table are in it.
    assert any(n.startswith("tokenkeys/keys/_chains.") for n in names)
    assert any(n.startswith("tokenkeys/router/index/_table.") for n in names)
    assert "tokenkeys = tokenkeys.cli:main" in entry_points
    assert 'Requires-Dist: smg-grpc-proto==0.4.28; extra == "smg"' in metadata
    with tarfile.open(dist / f"tokenkeys-{VERSION}.tar.gz") as sdist:
        members = set(sdist.getnames())
    assert f"tokenkeys-{VERSION}/pyproject.toml" in members


def _face_answers(bin_dir: Path, installed_at: Path) -> None:
    """Start the installed ``tokenkeys serve --vllm-engine-face``; prove it answers smg's calls
    and serves the tokenizer of the package installed at ``installed_at``."""
    with Served("--vllm-engine-face", program=[str(bin_dir / "tokenkeys")]) as served:
        with grpc.insecure_channel(served.grpc_target) as channel:
            stub = vllm_engine_pb2_grpc.VllmEngineStub(channel)
            assert stub.HealthCheck(pb.HealthCheckRequest(), timeout=30).healthy
            info = stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=30)
            ids = [1, 504, 3458, 4874, 260]
            (done,) = stub.Generate(
                pb.GenerateRequest(
                    request_id="package",
                    tokenized=pb.TokenizedInput(input_ids=ids),
                    sampling_params=pb.SamplingParams(max_tokens=3, ignore_eos=True),
                ),
                timeout=60,
            )
    assert Path(info.tokenizer_path).resolve().is_relative_to(installed_at.resolve()), info
    assert info.is_generation and info.vocab_size > 0
    assert (done.complete.prompt_tokens, done.complete.completion_tokens) == (len(ids), 3)


def test_the_wheel_with_its_smg_extra_serves_the_vllm_engine_face(venv: Path) -> None:
    _face_answers(venv, installed_at=venv.parent)


def test_an_editable_install_with_its_smg_extra_serves_the_vllm_engine_face(venv: Path) -> None:
    done = subprocess.run(
        [str(venv / "python"), "-m", "pip", "install", "-q", "-e", f"{REPO}[smg]"],
        capture_output=True,
        text=True,
        timeout=900,
    )
    if done.returncode != 0:
        unavailable(f"pip install -e '.[smg]' failed: {done.stderr[-2000:]}")
    _face_answers(venv, installed_at=REPO / "src")
