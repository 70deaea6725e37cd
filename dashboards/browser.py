"""Headless Chromium (Debian's `chromium`): load a report offline and read back
what its READY_SCRIPT recorded on <body> (figures drawn, JavaScript errors)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--no-first-run", "--disable-sync", "--virtual-time-budget=60000"]


def available() -> bool:
    return shutil.which("chromium") is not None


def run(profile: Path, *args: str, timeout: float = 600) -> str:
    """Chromium's stdout for these arguments, with its own profile directory."""
    p = subprocess.run([shutil.which("chromium"), *FLAGS, f"--user-data-dir={profile}", *args],
                       capture_output=True, text=True, timeout=timeout)
    return p.stdout


def body(page: Path, profile: Path) -> str:
    """The <body> tag of the page once loaded: data-figures and data-errors, if any."""
    found = re.search(r"<body[^>]*>", run(profile, "--dump-dom", page.resolve().as_uri()))
    return found.group(0) if found else "(no DOM)"
