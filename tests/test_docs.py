"""The user documentation stays in step with the code it describes.

- docs/diagnostics.md has a `### CODE: title` section for exactly the codes in CODES.
- Every `kspec <command>` the README shows is a command of `kspec --help`, and the
  README shows every command there is.
- .ci/run runs, character for character, the test command the README gives.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from kspec.codegen.diagnostics import CODES
from conftest import invoke_kspec

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")


def test_diagnostics_page_lists_exactly_the_codes():
    page = (ROOT / "docs" / "diagnostics.md").read_text(encoding="utf-8")
    documented = dict(re.findall(r"^### ([A-Z]\d{3}): (.+)$", page, re.M))
    assert sorted(set(CODES) - set(documented)) == [], "codes missing from docs/diagnostics.md"
    assert sorted(set(documented) - set(CODES)) == [], "docs/diagnostics.md lists codes that CODES does not"
    wrong = {c: (documented[c], t) for c, t in CODES.items() if documented[c] != t}
    assert wrong == {}, "titles in docs/diagnostics.md differ from CODES (page, code)"


def _help_commands() -> set:
    r = invoke_kspec("--help", cwd=ROOT)
    assert r.rc == 0, r.both
    out = r.out
    section = out.split("Commands:", 1)[1]
    return set(re.findall(r"^  ([a-z][a-z-]*)\s", section, re.M))


def _readme_commands() -> set:
    """Command names in `kspec ...` lines of code blocks and inline code spans."""
    blocks = re.findall(r"^```[a-z]*\n(.*?)^```", README, re.M | re.S)
    lines = [ln for b in blocks for ln in b.splitlines()] + re.findall(r"`([^`\n]+)`", README)
    found = set()
    for line in lines:
        found.update(re.findall(r"(?:^|[\s;&|(])kspec ([a-z][a-z-]*)\b", line.strip()))
    return found


def test_readme_commands_are_the_cli_commands():
    shown, real = _readme_commands(), _help_commands()
    assert {"check", "generate", "verify", "bench"} <= shown
    assert sorted(shown - real) == [], "README shows commands that `kspec --help` does not list"
    assert sorted(real - shown) == [], "README does not show these commands of `kspec --help`"


def test_ci_runs_the_readme_test_command():
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    command = [ln for ln in ci.splitlines() if ln.strip() and not ln.startswith("#")][-1]
    assert "pytest" in command and '-m "not slow"' in command
    assert command in [ln.strip() for ln in README.splitlines()], "README.md must give .ci/run's last line as its test command"
    assert (ROOT / ".ci" / "run").stat().st_mode & 0o111, ".ci/run must be executable"


def test_help_shows_each_command_whole():
    out = subprocess.run([sys.executable, "-m", "kspec", "--help"], cwd=ROOT, capture_output=True, text=True,
                         check=True, env={**os.environ, "COLUMNS": "80"}).stdout
    lines = [ln for ln in out.split("Commands:", 1)[1].split("Examples:", 1)[0].splitlines() if ln.strip()]
    assert len(lines) == len(_help_commands())
    assert [ln for ln in lines if ln.rstrip().endswith(("...", "\u2026")) or not ln.rstrip().endswith(".")] == []


def test_help_texts_point_at_documentation_an_installed_user_has():
    cli = (ROOT / "cli.py").read_text(encoding="utf-8")
    assert re.findall(r"docs/[a-z-]+\.md", cli) == []


def test_the_manual_is_readable_from_the_command_line():
    def kspec_docs(*args):
        return subprocess.run([sys.executable, "-m", "kspec", "docs", *args], cwd=ROOT, capture_output=True, text=True)

    listing = kspec_docs()
    assert listing.returncode == 0 and re.search(r"^verify\s+\S", listing.stdout, re.M), listing.stdout
    page = kspec_docs("verify")
    assert page.returncode == 0 and page.stdout == (ROOT / "docs" / "verify.md").read_text(encoding="utf-8")
    wrong = kspec_docs("verfy")
    assert wrong.returncode == 2 and "did you mean `verify`?" in wrong.stderr
