"""Maps the import package `dralloc` onto services/ and `dralloc.schemas` onto schemas/.

pyproject.toml holds the metadata; only this mapping needs code, because
setuptools' declarative package discovery cannot rename directories.
"""

from setuptools import find_packages, setup

packages = ["dralloc", "dralloc.schemas"]
packages += [f"dralloc.{p}" for p in find_packages("services")]
packages += [f"dralloc.schemas.{p}" for p in find_packages("schemas")]

setup(
    packages=packages,
    package_dir={"dralloc": "services", "dralloc.schemas": "schemas"},
    package_data={"dralloc.schemas": ["*.yaml", "jsonschema/*.json"]},
)
