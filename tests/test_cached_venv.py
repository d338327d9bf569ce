"""The cached virtualenv builder: built once, locked, never reused half-built, clear failures."""

from __future__ import annotations

import subprocess
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest

from cached_venv import COMPLETE_MARKER, RunPython, VenvRecipe, VenvUnavailable, ensure_venv


def _counting_recipe(counter: Path, name: str = "counting") -> VenvRecipe:
    """A recipe whose one step appends a line to ``counter``: the count is the number of builds."""
    code = f"open({str(counter)!r}, 'a').write('built\\n')"
    # Without pip: these tests are about the cache, and ensurepip costs seconds per environment.
    return VenvRecipe(name, steps=(RunPython("count the build", code),), with_pip=False)


def _ensure_in_child(recipe: VenvRecipe, root: Path) -> str:
    return str(ensure_venv(recipe, root))


def test_builds_once_and_reuses_the_complete_environment(tmp_path: Path) -> None:
    counter = tmp_path / "count"
    recipe = _counting_recipe(counter)
    python = ensure_venv(recipe, tmp_path / "envs")
    assert python.parent.parent.joinpath(COMPLETE_MARKER).is_file()
    ran = subprocess.run([str(python), "-c", "import sys; print(sys.prefix)"], capture_output=True)
    assert ran.stdout.decode().strip() == str(python.parent.parent)
    assert ensure_venv(recipe, tmp_path / "envs") == python
    assert counter.read_text() == "built\n"


def test_concurrent_builders_build_once(tmp_path: Path) -> None:
    counter = tmp_path / "count"
    recipe = _counting_recipe(counter, "concurrent")
    with ProcessPoolExecutor(2) as pool:
        pythons = list(pool.map(_ensure_in_child, [recipe, recipe], [tmp_path, tmp_path]))
    assert pythons[0] == pythons[1]
    assert counter.read_text() == "built\n"


def test_a_folder_without_its_marker_is_rebuilt(tmp_path: Path) -> None:
    counter = tmp_path / "count"
    recipe = _counting_recipe(counter, "interrupted")
    folder = tmp_path / f"interrupted-{recipe.digest()}"
    (folder / "bin").mkdir(parents=True)  # what a build killed half-way leaves behind
    (folder / "bin" / "leftover").write_text("half")
    python = ensure_venv(recipe, tmp_path)
    assert not (folder / "bin" / "leftover").exists()
    assert python == folder / "bin" / "python"
    assert counter.read_text() == "built\n"


def test_a_failed_step_names_itself_and_leaves_nothing(tmp_path: Path) -> None:
    code = "import sys; print('No matching distribution found for torch==0.0'); sys.exit(3)"
    recipe = VenvRecipe("failing", steps=(RunPython("install torch", code),), with_pip=False)
    with pytest.raises(VenvUnavailable) as caught:
        ensure_venv(recipe, tmp_path)
    reason = str(caught.value)
    assert "step 'install torch' failed (exit status 3)" in reason
    assert "No matching distribution found for torch==0.0" in reason
    assert not (tmp_path / f"failing-{recipe.digest()}").exists()
    assert (tmp_path / f"failing-{recipe.digest()}.log").is_file()


def test_the_recipe_hash_covers_the_steps() -> None:
    one = VenvRecipe("x", steps=(RunPython("a", "pass"),))
    assert one.digest() == VenvRecipe("x", steps=(RunPython("a", "pass"),)).digest()
    assert one.digest() != VenvRecipe("x", steps=(RunPython("a", "pass;"),)).digest()
    assert one.digest() != VenvRecipe("x", steps=(RunPython("a", "pass"),), env={"A": "1"}).digest()
