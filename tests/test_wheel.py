"""A built wheel carries the presets, zoos and meta-networks: installed outside the checkout,
`wsym report --quick` runs on the shipped default zoo."""

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _checkout_files() -> list[str]:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs a git checkout to build the wheel from")
    listed = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    return [f for f in listed.stdout.splitlines() if (ROOT / f).is_file()]


@pytest.mark.slow
def test_installed_wheel_runs_the_quick_report_outside_the_checkout(tmp_path):
    source = tmp_path / "source"
    for name in _checkout_files():
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, source / name)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    wheels = tmp_path / "wheels"
    build = pip + ["wheel", "--no-deps", "--no-build-isolation", "-w", str(wheels), str(source)]
    subprocess.run(build, check=True, cwd=tmp_path)
    (wheel,) = wheels.glob("wsym-*.whl")
    # a fresh venv: the wheel unpacked into its site-packages (what an installer does for a
    # pure-Python wheel), the dependencies read from this environment's site-packages
    # through a path file (which does not run this environment's editable install of wsym)
    fresh = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(fresh)], check=True)
    python = fresh / "bin" / "python"
    query = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    site = Path(
        subprocess.run(
            [python, "-c", query], capture_output=True, text=True, check=True
        ).stdout.strip()
    )
    (site / "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(site)
    assert (site / "wsym" / "_shipped" / "data" / "presets" / "mnist1d-mlp.json").is_file()
    out = tmp_path / "report"
    script = (
        "import sys, wsym; from wsym.cli.main import main; "
        f"assert wsym.__file__.startswith({str(site)!r}), wsym.__file__; "
        f"sys.exit(main(['report', '--quick', '--out', {str(out)!r}, '--json']))"
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"TQDM_DISABLE": "1"}
    run = subprocess.run(
        [python, "-c", script], cwd=elsewhere, env=env, capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr[-2000:]
    numbers = json.loads((out / "report.json").read_text())
    assert numbers["symmetries"]["kinds"] == {"permutation": 2, "scaling": 2}
    assert "metanet" in numbers and (out / "report.html").is_file()
