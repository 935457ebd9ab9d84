"""Sphinx configuration: ``sphinx-build -W --keep-going -b html docs docs/_build/html`` (``tox -e docs``).

Guides are MyST Markdown (``myst_parser``); the API reference is autodoc over the package's docstrings, and the
command-line reference is generated from the argparse parser (``_ext/apsi_cli.py``).
"""

from __future__ import annotations

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # the checkout's package, also where it was not installed
sys.path.insert(0, os.path.join(HERE, "_ext"))

from apsi_memory import _version

project = "apsi_memory"
author = "the apsi_memory authors"
copyright = "the apsi_memory authors, MIT licence"
release = version = _version.version()

extensions = ["sphinx.ext.autodoc", "myst_parser", "apsi_cli"]
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
exclude_patterns = ["_build"]
myst_heading_anchors = 3
myst_enable_extensions = ["colon_fence"]

autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_preserve_defaults = True
autodoc_default_options: dict[str, object] = {}  # {"members": False} hid the members a directive asks for (Sphinx 9)
add_module_names = False
nitpicky = False

html_theme = "furo"
html_title = f"apsi_memory {release}"
