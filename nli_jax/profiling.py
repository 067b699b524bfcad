"""Where a compiled XLA program's time goes, by the Python source that traced each operation.

jax's profiler records every executed thunk of a compiled program on CPU (an XLA instruction: a
fusion, a dot, a copy) with its duration; the compiled module's text names each instruction's
Python stack (its StackFrames table). `attribute` gives each thunk's time to the innermost frame
under a source root (this repository by default), split into forward and backward (the
`transpose(jvp(...))` of its op name); a fusion counts as its dot's operation where it holds one
(a dot fused with its neighbours is the dot's cost), else as itself (its metadata is its root's).
Thunks run on the program's threads side by side, so their summed time exceeds the wall time.

    compiled = jitted.lower(*args).compile()
    program = parse_program(compiled.as_text())
    with jax.profiler.trace(trace_dir):
        ...  # run `compiled`
    attribution = attribute(program, thunk_seconds(trace_dir, program.instructions))

benchmarks/step_profile.py applies it to the training loop's own step.
"""
from __future__ import annotations

import collections
import dataclasses
import functools
import glob
import os
import re

from jax.profiler import ProfileData

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Instructions that only hold others (their nested thunks are recorded themselves).
CONTAINERS = {"while", "conditional", "call", "async-start", "async-done"}
MATMULS = {"dot", "convolution"}


@dataclasses.dataclass(frozen=True)
class Frame:
    file: str
    function: str
    line: int


@dataclasses.dataclass(frozen=True)
class Instruction:
    name: str
    opcode: str
    op_name: str
    frame: int  # stack_frame_id, 0: none
    calls: tuple[str, ...]  # the computations it runs (a fusion's fused computation)


@dataclasses.dataclass
class Program:
    """A compiled module's instructions by computation and the Python stacks that made them."""
    computations: dict[str, list[Instruction]]
    stacks: dict[int, tuple[Frame, ...]]  # stack_frame_id -> frames, innermost first

    @functools.cached_property
    def instructions(self) -> dict[str, Instruction]:
        return {i.name: i for body in self.computations.values() for i in body}

    def origin(self, name: str) -> Instruction:
        """The instruction whose source a thunk's time belongs to: a fusion's dot where it has
        one, else the fusion itself (its metadata is its root's)."""
        instruction = self.instructions[name]
        for called in instruction.calls:
            for inner in self.computations.get(called, ()):
                if inner.opcode in MATMULS:
                    return inner
        return instruction

    def source(self, instruction: Instruction, root: str = REPO) -> Frame | None:
        """The innermost frame under `root` of the instruction's stack, its file relative to
        `root` (None: no stack, or none of it there)."""
        prefix = root.rstrip(os.sep) + os.sep
        for frame in self.stacks.get(instruction.frame, ()):
            if frame.file.startswith(prefix):
                return dataclasses.replace(frame, file=frame.file[len(prefix):])
        return None


_TABLE = re.compile(r"^(FileNames|FunctionNames|FileLocations|StackFrames)$")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%([\w.\-]+) = .*? ([a-z][\w\-]*)\(")
_COMPUTATION = re.compile(r"^(?:ENTRY )?%([\w.\-]+) ")


def parse_program(text: str) -> Program:
    """A compiled HloModule's text (`compiled.as_text()`): its computations' instructions with their
    op names and stack frame ids, and the module's stack frame tables resolved to frames."""
    tables: dict[str, dict[int, str]] = collections.defaultdict(dict)
    computations: dict[str, list[Instruction]] = {}
    table, current = None, None
    for line in text.splitlines():
        if _TABLE.match(line):
            table = line
            continue
        if table and re.match(r"^\d+ ", line):
            key, _, value = line.partition(" ")
            tables[table][int(key)] = value
            continue
        table = None
        if line.endswith("{") and (header := _COMPUTATION.match(line)):
            current = header.group(1)
            computations[current] = []
            continue
        if current is None or not (match := _INSTRUCTION.match(line)):
            continue
        op_name = re.search(r'op_name="([^"]*)"', line)
        frame = re.search(r"stack_frame_id=(\d+)", line)
        calls = re.findall(r"(?:calls|body|condition|to_apply)=%([\w.\-]+)", line)
        computations[current].append(Instruction(match.group(1), match.group(2), op_name.group(1) if op_name else "",
                                                 int(frame.group(1)) if frame else 0, tuple(calls)))

    def field(entry: str, key: str) -> str:
        return re.search(rf"{key}=(\d+)", entry).group(1)

    files = {k: v.strip('"') for k, v in tables["FileNames"].items()}
    functions = {k: v.strip('"') for k, v in tables["FunctionNames"].items()}
    locations = {k: Frame(files[int(field(v, "file_name_id"))], functions[int(field(v, "function_name_id"))],
                          int(field(v, "line"))) for k, v in tables["FileLocations"].items()}
    # parent_frame_id is printed one above the parent's id (0: the outermost frame).
    parents = {k: (int(field(v, "file_location_id")), int(field(v, "parent_frame_id")) - 1)
               for k, v in tables["StackFrames"].items()}
    stacks = {}
    for frame_id in parents:
        frames, at = [], frame_id
        while at > 0 and len(frames) < 200:
            location, at = parents[at]
            frames.append(locations[location])
        stacks[frame_id] = tuple(frames)
    return Program(computations, stacks)


def thunk_seconds(trace_dir: str, names) -> dict[str, float]:
    """Summed duration per instruction name of the thunks a jax.profiler trace recorded (events of
    other names, the runtime's own, are left out)."""
    (path,) = glob.glob(os.path.join(trace_dir, "**", "*.xplane.pb"), recursive=True)
    totals: dict[str, float] = collections.defaultdict(float)
    for plane in ProfileData.from_file(path).planes:
        for line in plane.lines:
            for event in line.events:
                if event.name in names:
                    totals[event.name] += event.duration_ns * 1e-9
    return dict(totals)


@dataclasses.dataclass
class Attribution:
    """Seconds per (function, direction), per source line, per instruction kind, over the profiled steps."""
    by_function: dict[tuple[str, str], float]
    by_line: dict[str, float]
    by_kind: dict[str, float]
    total: float
    unattributed: float


def attribute(program: Program, seconds: dict[str, float], root: str = REPO) -> Attribution:
    by_function, by_line, by_kind = (collections.defaultdict(float) for _ in range(3))
    instructions, total, unattributed = program.instructions, 0.0, 0.0
    for name, s in seconds.items():
        if instructions[name].opcode in CONTAINERS:
            continue
        total += s
        origin = program.origin(name)
        by_kind["dot" if origin.opcode in MATMULS else
                "copy / transpose" if origin.opcode in {"copy", "transpose"} else "other"] += s
        frame = program.source(origin, root) or program.source(instructions[name], root)
        if frame is None:  # XLA's own (a layout copy, a donated buffer's update): named by its opcode
            unattributed += s
            by_function[("(no source)", "")] += s
            by_line[f"(no source) {origin.opcode} {origin.name}"] += s
            continue
        direction = "backward" if "transpose(" in origin.op_name else "forward"
        by_function[(f"{frame.file}:{frame.function}", direction)] += s
        by_line[f"{frame.file}:{frame.line} ({frame.function})"] += s
    return Attribution(dict(by_function), dict(by_line), dict(by_kind), total, unattributed)


