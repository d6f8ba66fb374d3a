"""The installed layout: every subpackage ships, under the unambiguous name ``attnformal``."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def declared():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    return set(config["packages"]), config["package-dir"]


def test_every_subpackage_is_declared():
    packages, _ = declared()
    on_disk = {"attnformal." + ".".join(p.parent.relative_to(ROOT / "attnformal").parts)
               for p in (ROOT / "attnformal").rglob("__init__.py")}
    on_disk = {name.rstrip(".") for name in on_disk}
    missing = on_disk - packages
    assert not missing, f"add to [tool.setuptools] packages in pyproject.toml: {sorted(missing)}"


def test_top_level_folders_install_inside_the_package():
    packages, package_dir = declared()
    assert package_dir["attnformal.proofs"] == "proofs" and package_dir["attnformal.kernels"] == "kernels"
    assert all(name == "attnformal" or name.startswith("attnformal.") for name in packages)
