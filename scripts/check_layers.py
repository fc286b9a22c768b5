#!/usr/bin/env python3
"""Checks that no #include runs back up the layers (docs/architecture.md, "Layers").

Every header and source under a layer's folder may include its own layer and the layers
listed for it below, nothing else. A layer's folder includes its subfolders unless those are
layers of their own (the longest matching prefix decides). Prints each offending include with
file and line and exits 1; exits 0 when every include points down.
Usage: check_layers.py [repository root]
"""
import pathlib
import re
import sys

# Layer -> the layers it may include, besides itself. Bottom first.
ALLOWED = {
    "base": [],
    "kernels": ["base"],
    "transport": ["base", "kernels"],
    "core/topology": ["base"],
    "core/tracing": ["base", "core/topology"],
    "core": ["base", "kernels", "transport", "core/topology", "core/tracing"],
    "core/dispatch": ["base", "kernels", "transport", "core", "core/topology", "core/tracing"],
    "launcher": ["base", "kernels", "transport", "core", "core/topology", "core/tracing",
                 "core/dispatch"],
    "launcher/tools": ["base", "kernels", "transport", "core", "core/topology", "core/tracing",
                       "core/dispatch", "launcher"],
    # The NCCL plugin stands on the messenger alone (no communicator, no store); NIC discovery
    # is the launcher's (interfaces.cc, discovery/sysfs_files.cc), compiled into the plugin.
    "plugins/nccl": ["base", "transport", "launcher"],
    "python": ["base", "kernels", "transport", "core", "core/topology", "core/tracing",
               "core/dispatch", "launcher"],
}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def layer_of(path: str):
    """The layer a repository-relative path belongs to: the longest matching folder."""
    best = None
    for layer in ALLOWED:
        if path == layer or path.startswith(layer + "/"):
            if best is None or len(layer) > len(best):
                best = layer
    return best


def main() -> int:
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".").resolve()
    problems = []
    checked = 0
    for file in sorted(root.rglob("*")):
        if file.suffix not in (".h", ".cc", ".cu", ".cuh") or not file.is_file():
            continue
        rel = file.relative_to(root).as_posix()
        own = layer_of(rel)
        if own is None:
            continue  # tests, benchmarks, fuzz, examples, build trees: may include anything
        checked += 1
        for number, line in enumerate(file.read_text(errors="replace").splitlines(), 1):
            match = INCLUDE.match(line)
            if not match:
                continue
            target = match.group(1)
            if not (root / target).exists():
                continue  # a same-folder include or a generated header: not a layer arrow
            to = layer_of(target)
            if to is None or to == own or to in ALLOWED[own]:
                continue
            problems.append(f"{rel}:{number}: layer '{own}' includes '{target}' "
                            f"(layer '{to}'; '{own}' may include {ALLOWED[own] or 'nothing'})")
    for problem in problems:
        print(problem)
    print(f"check_layers: {checked} files, {len(problems)} include(s) against the layers")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
