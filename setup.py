"""Maps the import package `dralloc` onto services/ and `dralloc.schemas` onto schemas/, and, with
DRALLOC_NATIVE=1, compiles the engine's search modules with mypyc (README "Native build").

pyproject.toml holds the metadata; only this needs code: setuptools' declarative package discovery
cannot rename directories, and mypyc is asked for only on request.

The native build compiles the same strictly typed sources (`.ci/typecheck` checks them) to C
extensions: no second implementation. It is for installs that copy the package (`pip install .`,
`--target`): an editable install would put the compiled modules beside the sources, where they
would shadow every later edit, so it is refused. The modules compiled are the search's, which
recurse only as deep as a claim's requests and devices (bounded by validation); those that walk
user input of any depth (the CEL modules, `projection`) stay interpreted, where Python's recursion
limit, not the C stack, ends a hostile nesting (compiled, `projection.fields` of a 5,000-deep
expression returned `()` where it must return None).
"""

import os
import shutil
import sys

from setuptools import find_packages, setup

packages = ["dralloc", "dralloc.schemas"]
packages += [f"dralloc.{p}" for p in find_packages("services")]
packages += [f"dralloc.schemas.{p}" for p in find_packages("schemas")]

NATIVE_MODULES = (
    "engine",
    "placement",
    "search",
    "filters",
    "verdicts",
    "inventory",
    "ledger",
    "topology",
    "partitions",
    "misfits",
    "repeats",
    "plan",
    "projector",
)
"""The engine's modules the native build compiles (services/allocator/engine/<name>.py); tests/conftest.py
checks that a native run imports each compiled."""

MYPY_CONFIG = """[mypy]
python_version = 3.11
[mypy-networkx,networkx.*,re2,cel]
ignore_missing_imports = True
"""


def native_extensions() -> list:
    """The mypyc extensions of `NATIVE_MODULES`, or none unless DRALLOC_NATIVE=1."""
    if os.environ.get("DRALLOC_NATIVE") != "1":
        return []
    if any(arg.startswith("editable") for arg in sys.argv):
        raise SystemExit("DRALLOC_NATIVE=1 is for `pip install .` (not -e): compiled modules beside the sources would shadow every edit")
    if not {"bdist_wheel", "build_ext", "build", "install"} & set(sys.argv):
        return []  # (metadata only: nothing to compile)
    from mypyc.build import mypycify  # (mypy: install it first, and build with --no-build-isolation)

    # mypyc names a module by its path, so it compiles a copy laid out as the import package
    tree = os.path.join("build", "native-src")
    shutil.rmtree(tree, ignore_errors=True)
    shutil.copytree("services", os.path.join(tree, "dralloc"), ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    shutil.copytree("schemas", os.path.join(tree, "dralloc", "schemas"), ignore=shutil.ignore_patterns("__pycache__"))
    config = os.path.join(tree, "mypy.ini")
    with open(config, "w") as out:
        out.write(MYPY_CONFIG)
    sources = [os.path.join(tree, "dralloc", "allocator", "engine", f"{name}.py") for name in NATIVE_MODULES]
    return mypycify(["--config-file", config, *sources], opt_level="3")


setup(
    packages=packages,
    package_dir={"dralloc": "services", "dralloc.schemas": "schemas"},
    package_data={"dralloc.schemas": ["*.yaml", "jsonschema/*.json"]},
    ext_modules=native_extensions(),
)
