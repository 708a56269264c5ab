"""examples/python/ run natively: each example's main() against the loopback test
server, through a loopback context (over verbs, tests/verbs/python_client.rs runs
them as programs against the `server` binary)."""

from __future__ import annotations

import hashlib
import importlib.util
import pathlib
import types

import pytest

import rdmactor
from rdmactor import _testing

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples" / "python"


def example(name: str) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_echo_prints_the_reply_and_times_rounds(
    ctx: rdmactor.Context, addr: str, capsys: pytest.CaptureFixture[str]
) -> None:
    echo = example("echo")
    assert echo.main(["echo.py", addr, "hello from Python"], ctx) == 0
    assert capsys.readouterr().out == "echo: hello from Python\n"
    assert echo.main(["echo.py", addr, "", "200", "64"], ctx) == 0
    out = capsys.readouterr().out
    assert out.startswith("RESULT kind=py-echo size=64 rounds=200 p50_us="), out
    # Through a seed: the server lists itself as echo's only member.
    _testing.set_members("echo", [("self", addr)])
    assert echo.main(["echo.py", "--seeds", addr, "through a seed"], ctx) == 0
    assert capsys.readouterr().out == "echo: through a seed\n"


def test_files_uploads_and_checks_the_digest(
    ctx: rdmactor.Context, addr: str, tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    files = example("files")
    data = hashlib.shake_256(b"files.py").digest(5 << 20)
    path = tmp_path / "from-files-py.bin"
    path.write_bytes(data)
    assert files.main(["files.py", addr, str(path)], ctx) == 0
    want = hashlib.sha256(data).hexdigest()
    assert capsys.readouterr().out == f"GOOD {path} sha256:{want} {len(data)}\n"
    assert files.main(["files.py", addr, str(path)], ctx) == 1
    assert capsys.readouterr().out.startswith(f"REJECTED {path}: ")


def test_read_loop_sees_the_region_change(
    ctx: rdmactor.Context, addr: str, capsys: pytest.CaptureFixture[str]
) -> None:
    read_loop = example("read_loop")
    assert read_loop.main(["read_loop.py", addr, "ticker", "5", "0.01"], ctx) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 5
    versions = [int(line.split()[2].removeprefix("version=")) for line in lines]
    assert versions == sorted(versions) and versions[-1] > versions[0], lines
    # Every word of the ticker is its version: the head shows the same number.
    for line, v in zip(lines, versions):
        assert line.endswith(f"head={(v.to_bytes(8, 'little') * 2).hex()}"), line
