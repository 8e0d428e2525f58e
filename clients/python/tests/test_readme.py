"""The client guide's harness examples, extracted from docs/guide/clients.md and run as written
against a test supervisor (SBX_SOCKET names it), so the guide cannot drift; and the package
installs with pip. (The README's own Python workflow block is run by test/e2e/readme.test.ts.)"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import venv

from daemon import ROOT, Daemon

CLIENTS = os.path.join(ROOT, "docs", "guide", "clients.md")


def example_section() -> str:
    """The client guide, docs/guide/clients.md ("# Client library"), whole."""
    with open(CLIENTS) as f:
        text = f.read()
    assert text.startswith("# Client library\n"), "docs/guide/clients.md does not start with # Client library"
    return text


def example(lang: str) -> str:
    """The first ```lang block of the client guide (docs/guide/clients.md)."""
    section = example_section()
    m = re.search(r"^```" + lang + r"\n(.*?)^```$", section, re.S | re.M)
    assert m, f"no ```{lang} block in docs/guide/clients.md"
    return m.group(1)


EXPECTED = "3 exited b'built\\n' b'a warning\\n'\nstep 1\nstep 2\nstep 3\nexited 3 verified\nexited 0 verified\nKEY_CONFLICT False\n"


def test_the_python_example_runs_as_written(daemon: Daemon, tmp_path):
    script = tmp_path / "harness.py"
    script.write_text(example("python"))
    env = {**daemon.env(), "PYTHONPATH": os.path.join(ROOT, "clients", "python")}
    r = subprocess.run([sys.executable, str(script)], env=env, cwd=str(tmp_path), capture_output=True, timeout=60)
    assert (r.returncode, r.stderr.decode()) == (0, "")
    assert r.stdout.decode() == EXPECTED


def test_the_typescript_example_runs_as_written(daemon: Daemon, tmp_path):
    # As a user's project would have it: sandbox-supervisor in node_modules (here a link to this checkout).
    (tmp_path / "node_modules").mkdir()
    os.symlink(ROOT, tmp_path / "node_modules" / "sandbox-supervisor")
    (tmp_path / "harness.mts").write_text(example("ts"))
    tsx = os.path.join(ROOT, "node_modules", ".bin", "tsx")
    r = subprocess.run([tsx, "harness.mts"], env=daemon.env(), cwd=str(tmp_path), capture_output=True, timeout=60)
    assert (r.returncode, r.stderr.decode()) == (0, "")
    assert r.stdout.decode() == "step 1\nstep 2\nstep 3\nexited 0 verified\nKEY_CONFLICT false\n"


def test_pip_installs_the_package_with_its_types(tmp_path):
    # Offline (no PyPI here): a venv seeing the system's setuptools and msgpack, no build isolation.
    # From a copy: setuptools writes build/ and *.egg-info beside the sources it builds.
    source = tmp_path / "src"
    shutil.copytree(os.path.join(ROOT, "clients", "python"), source, ignore=shutil.ignore_patterns("tests", "__pycache__", ".pytest_cache", "build", "*.egg-info"))
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(system_site_packages=True, with_pip=False).create(env_dir)
    py = str(env_dir / "bin" / "python")
    pip = subprocess.run([py, "-m", "pip", "install", "--no-index", "--no-build-isolation", "--no-deps", "--quiet", str(source)], capture_output=True, cwd=str(tmp_path), timeout=120)
    assert pip.returncode == 0, pip.stderr.decode()
    check = "import os, sandbox_supervisor as s; d = os.path.dirname(s.__file__); print(s.__version__, os.path.exists(os.path.join(d, 'py.typed')), d.startswith(os.environ['VENV']))"
    r = subprocess.run([py, "-c", check], capture_output=True, cwd=str(tmp_path), env={**os.environ, "VENV": str(env_dir), "PYTHONPATH": ""})
    assert (r.returncode, r.stdout.decode()) == (0, "0.1.0 True True\n"), r.stderr.decode()


def test_the_offline_install_commands_run_as_written(tmp_path):
    # The client guide's sh block for installing without PyPI: its venv and pip lines, run as written
    # in a directory holding a copy of clients/python (setuptools writes build/ beside the sources).
    block = next(b for b in re.findall(r"^```sh\n(.*?)^```$", example_section(), re.S | re.M) if "--system-site-packages" in b)
    lines = [line.split("  #")[0].strip() for line in block.splitlines()]
    install = [line for line in lines if line.startswith("/usr/bin/python3 -m venv") or "pip install" in line]
    assert len(install) == 2, block
    assert any(line.startswith("PYTHONPATH=clients/python /usr/bin/python3 ") for line in lines), block
    shutil.copytree(os.path.join(ROOT, "clients", "python"), tmp_path / "clients" / "python", ignore=shutil.ignore_patterns("tests", "__pycache__", ".pytest_cache", "build", "*.egg-info"))
    for line in install:
        r = subprocess.run(line, shell=True, cwd=str(tmp_path), capture_output=True, timeout=180)
        assert r.returncode == 0, (line, r.stderr.decode())
    r = subprocess.run([str(tmp_path / ".venv" / "bin" / "python"), "-c", "import sandbox_supervisor as s; print(s.__file__)"], capture_output=True, cwd="/", env={**os.environ, "PYTHONPATH": ""})
    assert r.returncode == 0 and r.stdout.decode().startswith(str(tmp_path / ".venv")), r.stderr.decode()
