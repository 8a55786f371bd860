"""valgrind's options as users type them: alone, with =VALUE, or with VALUE after a space
(`--leak-check full` was taken as the report interval)."""

from __future__ import annotations

import pytest

from leaktrace.commands import ArgumentParser, load_command


def parsed(*words: str):
    parser = ArgumentParser(prog="leaktrace")
    load_command("trace").prepare_parser(parser)
    return parser.parse_args(["-c", "prog", *words])


@pytest.mark.parametrize(
    "words, leak_check, generate, interval",
    [
        (["--leak-check"], "full", None, 5.0),
        (["--leak-check", "full"], "full", None, 5.0),
        (["--leak-check", "summary", "2"], "summary", None, 2.0),
        (["--leak-check=no"], "no", None, 5.0),
        (["--leak-check", "3"], "full", None, 3.0),
        (["--leak-check", "--gen-suppressions", "yes", "7"], "full", "yes", 7.0),
        (["--gen-suppressions", "--leak-check", "full"], "full", "all", 5.0),
    ],
)
def test_valued_flags_take_their_value_alone_after_an_equals_or_a_space(words, leak_check, generate, interval):
    args = parsed(*words)
    assert (args.leak_check, args.gen_suppressions, args.interval) == (leak_check, generate, interval)


def test_the_program_and_its_arguments_after_two_dashes_are_the_command():
    args = parsed_without_c("--leak-check=full", "--error-exitcode=1", "2", "--", "./unit tests", "--flag", "a b")
    assert args.command == "'./unit tests' --flag 'a b'" and args.leak_check == "full" and args.interval == 2.0


def parsed_without_c(*words: str):
    parser = ArgumentParser(prog="leaktrace")
    load_command("trace").prepare_parser(parser)
    return parser.parse_args(list(words))


@pytest.mark.parametrize("words", [["--"], ["-c", "prog", "--", "other"], ["-p", "1", "--", "prog"]])
def test_two_dashes_without_a_program_or_beside_another_target_are_refused(words):
    from leaktrace.errors import UsageError

    with pytest.raises(UsageError):
        parsed_without_c(*words)


@pytest.mark.parametrize(
    "words, message",
    [
        (["-p", "1", "--engine", "preload", "--leak-check"], "--leak-check with --engine preload judges a command"),
        (["-c", "prog", "--leak-check", "--xml=yes"], "--xml=yes writes to --xml-file FILE: give both"),
        (["-c", "prog", "--leak-check", "-f", "--xml=yes", "--xml-file=x.xml"], "--xml-file needs %p with -f"),
        (["-c", "prog", "--error-exitcode=3"], "--error-exitcode needs --leak-check"),
    ],
)
def test_leak_check_combinations_that_cannot_work_are_refused(words, message):
    from leaktrace.commands.trace_arguments import check_leak_check
    from leaktrace.errors import UsageError

    with pytest.raises(UsageError, match=message):
        check_leak_check(parsed_without_c(*words))


@pytest.mark.parametrize("engine", ["bpf", "preload"])
def test_either_engine_judges_a_command_it_starts(engine):
    from leaktrace.commands.trace_arguments import check_leak_check

    check_leak_check(parsed_without_c("--engine", engine, "--leak-check=full", "--error-exitcode=1", "--", "./t"))
