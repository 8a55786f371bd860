"""`leaktrace completion bash|zsh`: a completion script for the shell, made from the commands'
own parsers (so it names every option there is), to be sourced or eval'ed."""

from __future__ import annotations

import argparse
import shlex

from . import REGISTRY, ArgumentParser, Command, load_command

SCRIPT = """_leaktrace() {{
    local cur=${{COMP_WORDS[COMP_CWORD]}} command=trace opts
    case "${{COMP_WORDS[1]}}" in
{commands}
    esac
    case $command in
{options}
    esac
    if [[ $cur == -* ]]; then
        COMPREPLY=($(compgen -W "$opts" -- "$cur"))
    elif [[ $COMP_CWORD == 1 ]]; then
        COMPREPLY=($(compgen -W "{names}" -- "$cur"))
    else
        COMPREPLY=($(compgen -f -- "$cur"))
    fi
}}
complete -o filenames -F _leaktrace leaktrace
"""
ZSH_PREAMBLE = "autoload -U +X bashcompinit && bashcompinit\n"  # zsh runs bash's completion functions


def options_of(name: str) -> list[str]:
    """Every option string of a command, as its parser knows them."""
    parser = ArgumentParser(prog=name)
    load_command(name).prepare_parser(parser)
    return sorted(option for action in parser._actions for option in action.option_strings)


def completion_script(shell: str) -> str:
    names = [name for name in REGISTRY]
    commands = "\n".join(f"        {shlex.quote(name)}) command={shlex.quote(name)} ;;" for name in names)
    options = "\n".join(
        f"        {shlex.quote(name)}) opts={shlex.quote(' '.join(options_of(name)))} ;;" for name in names
    )
    script = SCRIPT.format(commands=commands, options=options, names=" ".join(names + ["-p", "-c", "--all"]))
    return (ZSH_PREAMBLE if shell == "zsh" else "") + script


class CompletionCommand(Command):
    name = "completion"
    help = 'print a completion script for bash or zsh: eval "$(leaktrace completion bash)" in ~/.bashrc'

    def prepare_parser(self, parser: ArgumentParser) -> None:
        parser.add_argument("shell", choices=["bash", "zsh"])

    def run(self, args: argparse.Namespace) -> int:
        print(completion_script(args.shell), end="")
        return 0
