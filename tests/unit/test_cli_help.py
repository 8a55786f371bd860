"""The command line a new user meets first: --version, the top-level help, a bare call."""

from __future__ import annotations

import shlex
import subprocess
import sys

from leaktrace.commands import REGISTRY, SUMMARIES


def leaktrace(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "leaktrace.cli", *args], capture_output=True, text=True, timeout=60)


def test_version():
    result = leaktrace("--version")
    assert result.returncode == 0 and result.stdout.startswith("leaktrace ") and result.stderr == ""


def test_the_top_level_help_names_every_command_with_examples():
    result = leaktrace("--help")
    assert result.returncode == 0
    assert set(SUMMARIES) == set(REGISTRY)
    for name, line in SUMMARIES.items():
        assert f"  {name:18} {line}" in result.stdout
    assert "examples:\n  sudo leaktrace -p 1234 10" in result.stdout


def test_a_bare_call_prints_its_usage_and_what_it_needs():
    result = leaktrace()
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.startswith("usage: leaktrace ")
    assert result.stderr.splitlines()[-1] == (
        "leaktrace: needs -p PID, -c CMD or --all; leaktrace --help lists every command"
    )


def complete_in_bash(script: str, words: list[str]) -> list[str]:
    """What bash offers for the last of words, with the script's function."""
    program = (
        script
        + f"COMP_WORDS=({' '.join(shlex.quote(w) for w in words)}); COMP_CWORD={len(words) - 1}\n"
        + '_leaktrace; printf "%s\\n" "${COMPREPLY[@]}"\n'
    )
    return subprocess.run(["bash", "-c", program], capture_output=True, text=True, check=True).stdout.split()


def test_the_completion_script_offers_every_command_and_each_commands_options():
    from leaktrace.commands.completion import completion_script

    script = completion_script("bash")
    assert complete_in_bash(script, ["leaktrace", "--eng"]) == ["--engine"]
    assert complete_in_bash(script, ["leaktrace", "he"]) == ["heap"]
    assert "--unreachable" in complete_in_bash(script, ["leaktrace", "heap", "--"])
    assert "--engine" not in complete_in_bash(script, ["leaktrace", "heap", "--"])
    assert complete_in_bash(script, ["leaktrace", "-p", "1", "--kill"]) == ["--kill-on-exit"]
    assert completion_script("zsh").startswith("autoload -U +X bashcompinit && bashcompinit\n")
