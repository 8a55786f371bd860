"""Start-up is timed to probes live: bcc's compile starts before the rest of leaktrace
loads. By then no renderer, no numpy and no capstone may have been imported. And the
in-process engine's gate starts without bcc: no BPF module is loaded for it."""

from __future__ import annotations

import ast
import subprocess
import sys

# Runs the CLI for -p up to where it starts the compile, and prints the modules loaded then
# (the privilege checks are skipped: this runs anywhere).
SCRIPT = """
import sys
import leaktrace.commands.engines as engines
import leaktrace.sources.bpf.compile as compile

def report(*args, **kwargs):
    print(sorted(sys.modules))
    raise SystemExit(0)

engines.check_system = lambda: None
compile.compile_ahead = report
from leaktrace.cli import main
main(["-p", "1"])
"""


def test_nothing_heavy_is_imported_before_the_compile_starts():
    result = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, check=True)
    loaded = ast.literal_eval(result.stdout.strip())
    light = {"leaktrace.outputs", "leaktrace.outputs.renderers"}  # the formats' table: names, no renderer
    heavy = [
        name
        for name in loaded
        if name not in light
        and (
            name.split(".")[0] in ("numpy", "capstone", "google")
            or name.startswith(
                (
                    "leaktrace.outputs",
                    "leaktrace.analysis",
                    "leaktrace.reachability",
                    "leaktrace.sources.preload",
                    "leaktrace.android.leak",
                    "leaktrace.android.heap",
                )
            )
        )
    ]
    assert heavy == []
    assert "leaktrace.sources.bpf.compile" in loaded


# Runs the CLI for --engine preload -c up to where it launches the command.
PRELOAD_SCRIPT = """
import sys
import leaktrace.sources.preload.trace as trace

def report(*args, **kwargs):
    print(sorted(sys.modules))
    raise SystemExit(0)

trace.PreloadTrace.launch = report
from leaktrace.cli import main
main(["--engine", "preload", "--leak-check=full", "--", "/bin/true"])
"""


def test_the_in_process_gate_loads_no_bpf_module():
    result = subprocess.run([sys.executable, "-c", PRELOAD_SCRIPT], capture_output=True, text=True, check=True)
    loaded = ast.literal_eval(result.stdout.strip())
    assert [name for name in loaded if name.split(".")[0] in ("bcc", "numpy", "capstone")] == []
    shared = {"leaktrace.abi.layout"}  # the layouts generated from layout.h: no code
    assert [name for name in loaded if name.startswith("leaktrace.sources.bpf.") and name not in shared] == []
