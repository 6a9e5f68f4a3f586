"""Stage 1: YAML text -> plain data with the position of every node.

Only PyYAML's safe composer is used, and we build the Python values ourselves from
the node graph, so no constructor that could run code is ever reached. Anchors,
aliases and non-core tags are refused outright (alias-expansion bombs cannot
happen), duplicate keys are errors, and file size, node count, nesting depth and
scalar length are bounded so that hostile input fails fast.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import stat
from pathlib import Path
from typing import Any

import yaml

from kspec.codegen.diagnostics import Diagnostic, Location, SpecError

MAX_FILE_BYTES = 1 << 20  # 1 MiB: a spec is a page of text, not a data set
MAX_DEPTH = 32
MAX_NODES = 10_000  # the largest shipped spec has 400; parsing is pure Python, so this bounds time
MAX_NUMBER_CHARS = 40
MAX_STRING_CHARS = 64 * 1024

_CORE = "tag:yaml.org,2002:"
_SCALAR_TAGS = {"str", "int", "float", "bool", "null", "timestamp"}
# Line breaks to YAML (and str.splitlines) but not to editors, grep or git: raw in a
# file they would make every reported line number after them disagree with the editor's.
_HIDDEN_BREAKS = re.compile("[\x85\u2028\u2029]")
# YAML 1.1 reads `1e-5` (no dot) as a string; a spec author means a number.
_EXPONENT_FLOAT = re.compile(r"^[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+$")

Path_ = tuple  # a path into the data: keys and list indices


@dataclasses.dataclass(frozen=True)
class NodeInfo:
    """Where a value sits in the file, and how it was written."""

    loc: Location
    key_loc: Location | None  # the mapping key that holds it, if any
    style: str | None  # scalar style: None (plain), "'", '"', "|", ">"


@dataclasses.dataclass(frozen=True)
class Document:
    path: str
    text: str
    data: dict
    nodes: dict  # Path_ -> NodeInfo

    def info(self, path: Path_) -> NodeInfo:
        """The node at `path`, or its nearest ancestor that exists."""
        path = tuple(path)
        while path not in self.nodes and path:
            path = path[:-1]
        return self.nodes[path]

    def loc(self, path: Path_) -> Location:
        return self.info(path).loc

    def key_loc(self, path: Path_) -> Location:
        info = self.info(path)
        return info.key_loc or info.loc

    def text_loc(self, path: Path_, offset_line: int = 0, offset_col: int = 0) -> Location:
        """The location of a character inside a string scalar.

        offset_line/offset_col are 0-based within the string's value. Exact for
        plain, quoted (single-line) and literal block scalars.
        """
        info = self.info(path)
        loc = info.loc
        if info.style in ("|", ">"):
            first = loc.line + 1  # block content starts on the line after the indicator
            line = first + offset_line
            indent = _block_indent(self.text, first)
            return Location(loc.path, line, indent + offset_col + 1)
        quote = 1 if info.style in ("'", '"') else 0
        if offset_line == 0:
            return Location(loc.path, loc.line, loc.col + quote + offset_col)
        return Location(loc.path, loc.line + offset_line, offset_col + 1)


def _block_indent(text: str, line: int) -> int:
    lines = text.splitlines()
    for raw in lines[line - 1 :]:
        if raw.strip():
            return len(raw) - len(raw.lstrip(" "))
    return 0


class _LoadError(Exception):
    def __init__(self, code: str, message: str, mark, hint: str | None = None):
        self.code, self.message, self.mark, self.hint = code, message, mark, hint


class _Composer(yaml.SafeLoader):
    """The safe loader's composer, refusing anchors/aliases and deep nesting."""

    def __init__(self, stream):
        super().__init__(stream)
        self._depth = 0
        self._nodes = 0

    def compose_node(self, parent, index):
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent):
            raise _LoadError(
                "E103",
                f"alias `*{event.anchor}` is not allowed",
                event.start_mark,
                "write the value out in full; kspec specs do not use anchors or aliases",
            )
        if getattr(event, "anchor", None) is not None:
            raise _LoadError(
                "E103",
                f"anchor `&{event.anchor}` is not allowed",
                event.start_mark,
                "write the value out in full; kspec specs do not use anchors or aliases",
            )
        self._nodes += 1
        if self._nodes > MAX_NODES:
            raise _LoadError(
                "E105", f"spec has more than {MAX_NODES} YAML values", event.start_mark,
                "a spec is a page of declarations, not a data set",
            )
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise _LoadError("E108", f"nesting deeper than {MAX_DEPTH} levels", event.start_mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def _loc(path: str, mark) -> Location:
    return Location(path, mark.line + 1, mark.column + 1)


def _offset_to_loc(path: str, text: str, offset: int) -> Location:
    before = text[:offset]
    line = before.count("\n") + 1
    col = offset - (before.rfind("\n") + 1) + 1
    return Location(path, line, col)


class _Builder:
    """Turns a composed node graph into plain JSON-like data, recording positions."""

    def __init__(self, path: str):
        self.path = path
        self.nodes: dict = {}
        self.errors: list[Diagnostic] = []
        self._constructor = yaml.constructor.SafeConstructor()

    def build(self, node, at: tuple, key_loc: Location | None) -> Any:
        loc = _loc(self.path, node.start_mark)
        style = getattr(node, "style", None) if isinstance(node, yaml.ScalarNode) else None
        self.nodes[at] = NodeInfo(loc, key_loc, style)
        tag = node.tag
        if isinstance(node, yaml.MappingNode):
            if tag != _CORE + "map":
                return self._bad_tag(node, loc)
            return self._mapping(node, at)
        if isinstance(node, yaml.SequenceNode):
            if tag != _CORE + "seq":
                return self._bad_tag(node, loc)
            return [self.build(item, at + (i,), None) for i, item in enumerate(node.value)]
        return self._scalar(node, loc)

    def _mapping(self, node, at: tuple) -> dict:
        out: dict = {}
        for key_node, value_node in node.value:
            key_loc = _loc(self.path, key_node.start_mark)
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag not in (
                _CORE + "str",
                _CORE + "int",
                _CORE + "bool",
                _CORE + "null",
                _CORE + "float",
            ):
                if key_node.tag == _CORE + "merge":
                    self._bad_tag(key_node, key_loc)
                else:
                    self.errors.append(
                        Diagnostic("E200", "mapping keys must be plain strings", key_loc)
                    )
                continue
            key = key_node.value
            if key in out:
                first = self.nodes[at + (key,)].key_loc
                self.errors.append(
                    Diagnostic(
                        "E102",
                        f"duplicate key `{key}` (first defined at line {first.line})",
                        key_loc,
                        "remove one of the two entries",
                    )
                )
                continue
            out[key] = self.build(value_node, at + (key,), key_loc)
        return out

    def _scalar(self, node, loc: Location) -> Any:
        tag = node.tag
        if not tag.startswith(_CORE) or tag[len(_CORE) :] not in _SCALAR_TAGS:
            return self._bad_tag(node, loc)
        kind = tag[len(_CORE) :]
        value = node.value
        if kind == "str" and node.style is None and _EXPONENT_FLOAT.match(value):
            return float(value)
        if kind in ("str", "timestamp"):
            bad = yaml.reader.Reader.NON_PRINTABLE.search(value)  # from escapes: "\0", "\ud800"
            if bad:
                self.errors.append(
                    Diagnostic("E107", f"character U+{ord(bad.group()):04X} is not allowed in a spec", loc)
                )
                return ""
            if len(value) > MAX_STRING_CHARS:
                self.errors.append(
                    Diagnostic("E109", f"string longer than {MAX_STRING_CHARS} characters", loc)
                )
                return ""
            return value
        if kind in ("int", "float") and len(value) > MAX_NUMBER_CHARS:
            self.errors.append(
                Diagnostic("E109", f"number longer than {MAX_NUMBER_CHARS} characters", loc)
            )
            return 0
        construct = {
            "int": self._constructor.construct_yaml_int,
            "float": self._constructor.construct_yaml_float,
            "bool": self._constructor.construct_yaml_bool,
            "null": self._constructor.construct_yaml_null,
        }[kind]
        try:
            out = construct(node)
        except (ValueError, OverflowError):
            self.errors.append(Diagnostic("E203", f"`{value}` is not a valid {kind}", loc))
            return None
        if isinstance(out, float) and math.isnan(out):  # no bound, tolerance or floor can be checked against it
            self.errors.append(Diagnostic("E203", f"`{value}` is not a number: a spec's numbers may not be NaN", loc))
            return None
        return out

    def _bad_tag(self, node, loc: Location) -> None:
        self.errors.append(
            Diagnostic(
                "E104",
                f"tag `{node.tag}` is not allowed",
                loc,
                "specs hold plain strings, numbers, booleans, lists and mappings only",
            )
        )
        return None


def load_text(text: str, path: str) -> Document:
    """Parse spec text. Raises SpecError with located diagnostics."""
    hidden = _HIDDEN_BREAKS.search(text)
    if hidden:
        raise SpecError(
            [
                Diagnostic(
                    "E107",
                    f"character U+{ord(hidden.group()):04X} is not allowed in a spec",
                    _offset_to_loc(path, text, hidden.start()),
                    "YAML reads it as a line break and editors do not; in a double-quoted string, "
                    f"write it as the escape \\u{ord(hidden.group()):04x}",
                )
            ]
        )
    loader = None
    try:
        loader = _Composer(text)  # its reader rejects non-printable characters (NUL...) here
        root = loader.get_single_node()
    except _LoadError as e:
        raise SpecError([Diagnostic(e.code, e.message, _loc(path, e.mark), e.hint)]) from None
    except yaml.reader.ReaderError as e:
        raise SpecError(
            [
                Diagnostic(
                    "E107",
                    f"character U+{e.character:04X} is not allowed in a spec",
                    _offset_to_loc(path, text, e.position),
                )
            ]
        ) from None
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        message = " ".join(x for x in (e.context, e.problem) if x) or "malformed YAML"
        loc = _loc(path, mark) if mark else Location(path)
        raise SpecError([Diagnostic("E101", message, loc)]) from None
    except yaml.YAMLError as e:
        raise SpecError([Diagnostic("E101", str(e).splitlines()[0], Location(path))]) from None
    except RecursionError:
        raise SpecError([Diagnostic("E108", "YAML nested too deeply", Location(path))]) from None
    finally:
        if loader is not None:
            loader.dispose()
    if root is None:
        raise SpecError(
            [Diagnostic("E106", "spec is empty", Location(path), "start from specs/add.yaml")]
        )
    builder = _Builder(path)
    data = builder.build(root, (), None)
    if builder.errors:
        raise SpecError(builder.errors)
    if not isinstance(data, dict):
        raise SpecError(
            [
                Diagnostic(
                    "E106",
                    f"a spec must be a mapping of keys to values, not a {type(data).__name__}",
                    _loc(path, root.start_mark),
                )
            ]
        )
    return Document(path, text, data, builder.nodes)


class NotRegular(OSError):
    """A path that names something other than a regular file (a folder, a FIFO, a device)."""


_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def read_regular(path: str | Path, limit: int) -> bytes:
    """Up to `limit` + 1 bytes of a regular file. Anything else raises NotRegular before a byte is
    read: opening never blocks (O_NONBLOCK: a FIFO without a writer), and a link to a device such as
    /dev/zero is refused by what it is, not by how long it is."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = next((name for test, name in _KINDS if test(mode)), "not a regular file")
            raise NotRegular(f"{kind}, not a regular file")
        chunks, left = [], limit + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_text(path: str | Path) -> str:
    """Read a spec file as UTF-8 text within the size limit. Raises SpecError."""
    shown = str(path)
    try:
        raw = read_regular(path, MAX_FILE_BYTES)
    except NotRegular as e:
        raise SpecError([Diagnostic("E110", f"cannot read the spec file: it is {e}", Location(shown))]) from None
    except IsADirectoryError:
        raise SpecError([Diagnostic("E110", "cannot read the spec file: it is a folder, not a regular file",
                                    Location(shown))]) from None
    except OSError as e:
        raise SpecError([Diagnostic("E100", e.strerror or str(e), Location(shown))]) from None
    if len(raw) > MAX_FILE_BYTES:
        raise SpecError(
            [
                Diagnostic(
                    "E105",
                    f"spec file is larger than {MAX_FILE_BYTES // 1024} KiB",
                    Location(shown),
                )
            ]
        )
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        good = raw[: e.start].decode("utf-8")
        raise SpecError(
            [
                Diagnostic(
                    "E107",
                    f"byte 0x{raw[e.start]:02x} is not valid UTF-8",
                    _offset_to_loc(shown, good, len(good)),
                    "spec files are UTF-8 text",
                )
            ]
        ) from None


def load(path: str | Path) -> Document:
    return load_text(read_text(path), str(path))
