"""Which packages ship: every folder under cachesvc/, client/ (imported as cachesvc_client) and migrations/
(as cachesvc.migrations), found when the wheel is built. Everything else about the build is in pyproject.toml.

The list is found, never kept by hand: a hand-kept list in pyproject.toml forgot cachesvc.content, and the
wheel, the image and every Kubernetes overlay shipped a server that could not start (issue 37). It is made
here because setuptools' declarative ``[tool.setuptools.packages.find]`` names what it finds by its folder,
and client/ is imported as cachesvc_client. Every folder is a package, the data folders (templates/,
static/) as namespace packages, so pyproject.toml's ``package-data`` ("every file of every package") takes
their files with no list per folder. A folder named ``__pycache__`` is the one left out.
"""
from setuptools import find_namespace_packages, setup

#: import name -> its folder; pyproject.toml's [tool.setuptools.package-dir] maps the same two renames
ROOTS = {"cachesvc": "cachesvc", "cachesvc_client": "client", "cachesvc.migrations": "migrations"}


def packages() -> list:
    found = []
    for name, folder in ROOTS.items():
        found.append(name)
        found += [f"{name}.{sub}" for sub in find_namespace_packages(folder, exclude=["__pycache__", "*.__pycache__"])]
    return sorted(found)


setup(packages=packages())
