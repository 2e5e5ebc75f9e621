"""Where the page's downloads (traces, chart files) are written: one folder per tab, named by the server.

Nothing of a path comes from the client (the Gradio session hash is the client's choice, and `../` in it once
let a visitor write anywhere the server could). Each tab gets a random folder under one root; a tab keeps at
most its last few files, the whole root has a size cap, and a tab's folder is removed when the tab closes.
"""
from __future__ import annotations

import secrets
import shutil
import tempfile
import time
from pathlib import Path

ROOT = Path(tempfile.gettempdir()) / "inferlab-exports"
MAX_ROOT_BYTES = 512 * 1024 * 1024
MAX_FILES_PER_TAB = 4
STALE_AFTER_S = 6 * 3600  # folders a previous run of the server left behind


class DownloadsFull(ValueError):
    pass


class TabDownloads:
    def __init__(self, root: Path = ROOT):
        self.root = root
        self.path = root / secrets.token_hex(16)

    def folder(self) -> Path:
        """The tab's folder, ready for one more file: older files beyond the per-tab count are removed first,
        and a full root refuses the export with a message."""
        self.path.mkdir(parents=True, exist_ok=True)
        files = sorted(self.path.iterdir(), key=lambda f: f.stat().st_mtime)
        for f in files[: max(0, len(files) - (MAX_FILES_PER_TAB - 1))]:
            f.unlink(missing_ok=True)
        if folder_bytes(self.root) > MAX_ROOT_BYTES:
            raise DownloadsFull("the server's download space is full right now; try again in a few minutes")
        return self.path

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


def folder_bytes(root: Path) -> int:
    try:
        return sum(f.stat().st_size for f in root.rglob("*") if f.is_file())
    except OSError:  # a file vanished while counting (another tab's cleanup)
        return 0


def remove_stale(root: Path = ROOT, older_than_s: float = STALE_AFTER_S) -> None:
    """At start-up: remove tab folders older than `older_than_s` (a crashed server never closed them)."""
    if not root.is_dir():
        return
    now = time.time()
    for d in root.iterdir():
        try:
            if now - d.stat().st_mtime > older_than_s:
                shutil.rmtree(d, ignore_errors=True) if d.is_dir() else d.unlink(missing_ok=True)
        except OSError:
            pass
