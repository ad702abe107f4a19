"""The one exit-code table is what every command prints and what the README documents; the README's
model.pt snippet runs as written."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from gdn_deploy.errors import EXIT_CODES_HELP, ExitCode

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_exit_code_table_is_the_code_table():
    text = README.read_text()
    section = text[text.index("### Exit codes"):]
    rows = dict(re.findall(r"^\| (\d+) \| (.+?) \|$", section, flags=re.M))
    assert {int(k) for k in rows} == {int(c) for c in ExitCode}
    for code in ExitCode:
        assert f"{int(code)} " in EXIT_CODES_HELP, code


@pytest.mark.parametrize("module", ["gdn_deploy.export.cli", "gdn_deploy.export.check_cli"])
def test_every_cli_prints_the_one_table(module, capsys):
    import importlib
    with pytest.raises(SystemExit):
        importlib.import_module(module).main(["--help"])
    assert EXIT_CODES_HELP in capsys.readouterr().out


def test_build_cli_codes_come_from_the_table():
    from gdn_deploy.plugins import build_cli
    assert build_cli.EXIT_NO_TENSORRT == ExitCode.NO_TENSORRT and build_cli.EXIT_PLUGIN == ExitCode.PLUGIN
    assert build_cli.EXIT_PARSE == build_cli.EXIT_BUILD == ExitCode.TENSORRT and build_cli.EXIT_USAGE == ExitCode.USAGE


def test_readme_model_pt_snippet_runs(tmp_path, monkeypatch):
    text = README.read_text()
    start = text.index("A `model.pt` comes from PyTorch")
    code = re.search(r"```python\n(.*?)```", text[start:], flags=re.S).group(1)
    monkeypatch.chdir(tmp_path)
    exec(compile(code, "README.md", "exec"), {})
    from gdn_deploy.checkpoint import load_checkpoint
    lm = load_checkpoint(tmp_path / "model.pt")
    assert type(lm).__name__ == "GDNLM" and lm.config.num_layers == 4
