"""Running the tests leaves the curated screenshots alone (issue 37): the pictures tests take go to an ignored
folder (e2e_util.TEST_SHOTS), and only tests/screenshots.py, run as a script, writes assets/screenshots/."""
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from e2e_util import TEST_SHOTS

ROOT = Path(__file__).resolve().parent.parent
# the folder as a path in code: "assets" / "screenshots", or a string holding assets/screenshots
CURATED = re.compile(r"""["']assets["']\s*/\s*["']screenshots["']|["'][^"'\n]*assets/screenshots""")


def test_no_test_module_writes_the_curated_screenshots():
    writers = [p.name for p in sorted((ROOT / "tests").glob("*.py"))
               if p.name != "screenshots.py" and p.name != Path(__file__).name
               and CURATED.search(p.read_text(encoding="utf-8"))]
    assert not writers, f"these test modules name assets/screenshots/: {writers}"


@pytest.mark.skipif(shutil.which("git") is None or not (ROOT / ".git").exists(), reason="not a git checkout")
def test_the_test_pictures_folder_is_ignored_by_git():
    probe = TEST_SHOTS / "lab.png"
    done = subprocess.run(["git", "check-ignore", "-q", str(probe)], cwd=ROOT)
    assert done.returncode == 0, f"{probe} would be tracked"
