"""`kspec explain CODE`: a diagnostic's section of the manual, for an installed user."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def explain(*args):
    return subprocess.run([sys.executable, "-m", "kspec", "explain", *args], cwd=ROOT, capture_output=True, text=True)


def test_explain_prints_the_codes_section_of_the_diagnostics_page():
    r = explain("e602")  # any case
    page = (ROOT / "docs" / "diagnostics.md").read_text(encoding="utf-8")
    start = page.index("### E602: unknown name in code")
    section = page[start:page.index("\n#", start)].rstrip()
    assert r.returncode == 0 and r.stdout == section + "\n"
    assert "**Fix.**" in r.stdout and "### E603" not in r.stdout


def test_explain_an_unknown_code_is_a_usage_error_with_a_suggestion():
    r = explain("E6022")
    assert (r.returncode, r.stdout) == (2, "")
    assert r.stderr == "error: no diagnostic 'E6022' (did you mean `E602`?); `kspec docs diagnostics` lists them all\n"
