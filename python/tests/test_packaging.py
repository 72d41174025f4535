"""The installed package: version, typing markers, the native `relaunch` command."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import relaunch


def test_version_is_the_crate_version():
    root = Path(__file__).resolve().parents[2]
    cargo = (root / "Cargo.toml").read_text()
    assert f'version = "{relaunch.__version__}"' in cargo


def test_typing_markers_are_installed():
    package = Path(relaunch.__file__).parent
    assert (package / "py.typed").is_file()
    assert (package / "_native.pyi").is_file()


def test_relaunch_command_is_on_path_and_matches_python_m():
    exe = shutil.which("relaunch", path=os.path.dirname(sys.executable))
    assert exe, "pip install . must put `relaunch` next to the interpreter"
    # The Rust binary itself (build_backend/relaunch_build.py), not a
    # console script: no interpreter starts for a command.
    assert Path(exe).read_bytes()[:4] == b"\x7fELF", f"{exe} is not the native binary"
    out = subprocess.run([exe, "--version"], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == f"relaunch {relaunch.__version__}"
    out_m = subprocess.run(
        [sys.executable, "-m", "relaunch", "--version"], capture_output=True, text=True, check=True
    )
    assert out_m.stdout == out.stdout


def test_the_command_runs_workers_under_the_python_beside_it(tmp_path):
    """Run by its path with its environment off PATH (not activated), the
    command still runs workers under the environment's own Python, as the
    console script it replaces did."""
    exe = Path(sys.executable).parent / "relaunch"
    (tmp_path / "where.py").write_text("import sys\nprint('worker python:', sys.executable)\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHON_EXEC", "VIRTUAL_ENV")}
    env["PATH"] = "/usr/bin:/bin"
    out = subprocess.run(
        [exe, "run", "--nproc-per-node", "1", "where.py"],
        capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    (line,) = [x for x in out.stdout.splitlines() if "worker python:" in x]
    worker = Path(line.split("worker python:", 1)[1].strip())
    assert worker.parent == Path(sys.executable).parent, line


def test_import_is_light():
    """`import relaunch` must not drag in torch (it runs in every worker),
    nor any framework relaunch.integrations adapts to."""
    code = (
        "import sys, relaunch, relaunch.integrations; "
        "print([m for m in ('torch', 'lightning', 'transformers', 'accelerate') "
        "if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def _section_names(path: Path) -> set[str]:
    """The section names of an ELF64 little-endian file (its header table)."""
    import struct

    data = path.read_bytes()
    assert data[:4] == b"\x7fELF" and data[4] == 2 and data[5] == 1, path
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    headers = [struct.unpack_from("<IIQQQQ", data, shoff + i * shentsize) for i in range(shnum)]
    strtab_offset = headers[shstrndx][4]
    names = set()
    for name_offset, *_ in headers:
        end = data.index(b"\0", strtab_offset + name_offset)
        names.add(data[strtab_offset + name_offset : end].decode())
    return names


def test_shipped_artefacts_carry_no_debug_info_and_the_code_once():
    """Regression: the command (118 MB) and the extension module (125 MB)
    each carried unstripped debug info and the whole server. Now neither has
    debug info, and the extension holds no server, launcher command line or
    dashboard: `python -m relaunch` execs the command instead."""
    command = Path(sys.executable).parent / "relaunch"
    module = Path(relaunch._native.__file__)
    for artefact in (command, module):
        debug = {n for n in _section_names(artefact) if n.startswith(".debug_")}
        assert not debug, f"{artefact} has {sorted(debug)}"
    # Source paths in the logs' metadata name the crates linked in.
    assert b"crates/relaunch-server/" in command.read_bytes()  # the check can see it
    assert b"crates/relaunch-cli/" in command.read_bytes()
    assert b"crates/relaunch-server/" not in module.read_bytes()
    assert b"crates/relaunch-cli/" not in module.read_bytes()
    assert module.stat().st_size < 30 * 2**20, module.stat().st_size
    assert command.stat().st_size < 60 * 2**20, command.stat().st_size


def test_python_m_relaunch_runs_workers_under_its_own_interpreter(tmp_path):
    """`python -m relaunch` execs the native command and hands it the
    interpreter that ran it, which the workers run under (as when the CLI
    ran in-process)."""
    (tmp_path / "where.py").write_text("import sys\nprint('worker python:', sys.executable)\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHON_EXEC", "RELAUNCH_PYTHON")}
    out = subprocess.run(
        [sys.executable, "-m", "relaunch", "run", "where.py"],
        capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    (line,) = [x for x in out.stdout.splitlines() if "worker python:" in x]
    assert line.split("worker python:", 1)[1].strip() == sys.executable, line


def test_architectures_codemap_lists_every_file_as_it_says_of_itself():
    """ARCHITECTURE.md's one-line-per-file codemap is what
    scripts/codemap.py makes from the files' own opening doc lines: a file
    added, removed or renamed without it fails here."""
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [sys.executable, str(root / "scripts" / "codemap.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr


def _module_cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(edges[v]):
            if w not in edges:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return cycles


def _rust_module_edges(src: Path) -> dict[str, set[str]]:
    """Top-level module -> the top-level modules its code names through
    `crate::` (doc comments and the unit tests left out)."""
    import re

    edges: dict[str, set[str]] = {}
    for path in sorted(src.rglob("*.rs")):
        top = path.relative_to(src).parts[0].removesuffix(".rs")
        if top in ("lib", "main"):
            continue
        text = re.split(r"#\[cfg\(test\)\]\s*(?:pub(?:\(crate\))? )?mod tests", path.read_text())[0]
        code = "\n".join(line.split("//", 1)[0] for line in text.splitlines())
        named = set(re.findall(r"crate::([a-z_][a-z0-9_]*)", code))
        for group in re.findall(r"crate::\{([^}]*)\}", code):
            named |= set(re.findall(r"(?:^|,)\s*([a-z_][a-z0-9_]*)", group))
        edges.setdefault(top, set()).update(named - {top})
    return edges


def test_no_module_imports_itself_through_others():
    """Within each crate, and within the Python package's module-level
    imports, modules form a DAG (ARCHITECTURE.md, Invariants): a cycle
    added later fails here, naming its modules."""
    import re

    root = Path(__file__).resolve().parents[2]
    found = {}
    for crate in sorted((root / "crates").iterdir()):
        if (crate / "src").is_dir():
            cycles = _module_cycles(_rust_module_edges(crate / "src"))
            if cycles:
                found[crate.name] = cycles
    package = root / "python" / "relaunch"
    edges: dict[str, set[str]] = {}
    for path in sorted(package.rglob("*.py")):
        name = ".".join(path.relative_to(package).with_suffix("").parts)
        name = name.removesuffix(".__init__").removesuffix("__init__") or "relaunch"
        targets = set()
        for line in path.read_text().splitlines():  # column 0: module level
            m = re.match(r"from relaunch(\.[\w.]+)? import ([\w, ()]+)", line)
            if m and m.group(1):
                targets.add(m.group(1)[1:])
            m2 = re.match(r"import relaunch\.([\w.]+)", line)
            if m2:
                targets.add(m2.group(1))
        edges[name] = targets - {name}
    cycles = _module_cycles(edges)
    if cycles:
        found["python/relaunch"] = cycles
    assert not found, f"module import cycles: {found}"
