"""The public API: ``from cronwarden import …`` works for every documented
name, and importing the package loads none of them until asked."""

from __future__ import annotations

import subprocess
import sys

import cronwarden


def test_every_public_name_imports_from_the_package() -> None:
    for name in cronwarden.__all__:
        assert getattr(cronwarden, name) is not None, name


def test_all_lists_exactly_the_lazy_table() -> None:
    assert sorted(cronwarden.__all__) == sorted([*cronwarden._PUBLIC, "__version__"])


def test_import_cronwarden_loads_no_submodule() -> None:
    code = "import sys, cronwarden; print(sorted(m for m in sys.modules if m.startswith('cronwarden')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['cronwarden']"


def test_an_unknown_name_is_an_attribute_error() -> None:
    try:
        cronwarden.NoSuchThing  # noqa: B018
    except AttributeError as e:
        assert "NoSuchThing" in str(e)
    else:
        raise AssertionError("expected AttributeError")
