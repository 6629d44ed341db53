"""PyYAML's emitter with go-yaml v2's scalar rules.

Both emitters are ports of libyaml and lay out mappings and sequences alike; they part on
scalars: go-yaml decides what is printable on UTF-8 bytes (a character beyond U+FFFF is not, nor
U+FEFF), folds double-quoted strings only at spaces, and escapes with its own letters. This
emitter keeps PyYAML's structure and writes scalars as go-yaml's emitterc.go does (analysis,
style choice, the plain, single- and double-quoted writers; literal blocks are the same).
"""

from __future__ import annotations

from yaml.emitter import Emitter, ScalarAnalysis
from yaml.events import ScalarEvent

_BREAKS = "\r\n\x85\u2028\u2029"
_ESCAPES = {"\x00": "0", "\x07": "a", "\x08": "b", "\t": "t", "\n": "n", "\x0b": "v", "\x0c": "f", "\r": "r",
            "\x1b": "e", '"': '"', "\\": "\\", "\x85": "N", "\xa0": "_", "\u2028": "L", "\u2029": "P"}


def printable(ch: str) -> bool:
    """go-yaml's is_printable, read on code points rather than UTF-8 bytes."""
    c = ord(ch)
    return c == 0x0A or 0x20 <= c <= 0x7E or 0xA0 <= c <= 0xD7FF or (0xE000 <= c <= 0xFFFD and c != 0xFEFF)


def analyze(value: str) -> ScalarAnalysis:
    """yaml_emitter_analyze_scalar: which styles can hold `value`."""
    if not value:
        return ScalarAnalysis(value, True, False, False, True, True, True, False)
    flow = block = value.startswith(("---", "..."))
    special = line_breaks = leading_space = leading_break = trailing_space = trailing_break = False
    break_space = space_break = previous_space = previous_break = False
    preceded_by_whitespace = True
    last = len(value) - 1
    for i, ch in enumerate(value):
        followed_by_whitespace = i == last or value[i + 1] in " \t"
        if i == 0:
            if ch in "#,[]{}&*!|>'\"%@`":
                flow = block = True
            elif ch in "?:":
                flow = True
                block = block or followed_by_whitespace
            elif ch == "-" and followed_by_whitespace:
                flow = block = True
        elif ch in ",?[]{}":
            flow = True
        elif ch == ":":
            flow = True
            block = block or followed_by_whitespace
        elif ch == "#" and preceded_by_whitespace:
            flow = block = True
        special = special or not printable(ch)
        if ch == " ":
            leading_space = leading_space or i == 0
            trailing_space = trailing_space or i == last
            break_space = break_space or previous_break
            previous_space, previous_break = True, False
        elif ch in _BREAKS:
            line_breaks = True
            leading_break = leading_break or i == 0
            trailing_break = trailing_break or i == last
            space_break = space_break or previous_space
            previous_space, previous_break = False, True
        else:
            previous_space = previous_break = False
        preceded_by_whitespace = ch in " \t\x00" or ch in _BREAKS
    flow_plain = block_plain = single = block_ok = True
    if leading_space or leading_break or trailing_space or trailing_break:
        flow_plain = block_plain = False
    if trailing_space:
        block_ok = False
    if break_space:
        flow_plain = block_plain = single = False
    if space_break or special:
        flow_plain = block_plain = single = block_ok = False
    if line_breaks:
        flow_plain = block_plain = False
    if flow:
        flow_plain = False
    if block:
        block_plain = False
    return ScalarAnalysis(value, False, line_breaks, flow_plain, block_plain, single, True, block_ok)


class GoEmitter(Emitter):
    """Scalars as go-yaml v2 writes them (go.yaml.in/yaml/v2 emitterc.go)."""

    def analyze_scalar(self, scalar: str) -> ScalarAnalysis:
        return analyze(scalar)

    def check_simple_key(self) -> bool:
        # go-yaml: a scalar key of at most 128 bytes, empty or not; PyYAML: under 128 characters, not empty
        event = self.event
        if not isinstance(event, ScalarEvent):
            return bool(super().check_simple_key())
        if self.analysis is None:
            self.analysis = self.analyze_scalar(event.value)
        return not self.analysis.multiline and len(event.value.encode()) <= 128

    def choose_scalar_style(self) -> str:
        event = self.event
        assert isinstance(event, ScalarEvent)
        if self.analysis is None:
            self.analysis = self.analyze_scalar(event.value)
        a, style = self.analysis, event.style or ""
        if self.simple_key_context and a.multiline:
            style = '"'
        if style == "":
            if not (a.allow_flow_plain if self.flow_level else a.allow_block_plain):
                style = "'"
            if a.empty and (self.flow_level or self.simple_key_context):
                style = "'"
        if style == "'" and not a.allow_single_quoted:
            style = '"'
        if style in "|>" and style and (not a.allow_block or self.flow_level or self.simple_key_context):
            style = '"'
        return style

    def _put(self, text: str) -> None:
        self.column += len(text)
        self.stream.write(text)

    def _write_break(self, ch: str) -> None:
        if ch == "\n":
            self.write_line_break()
        else:
            self.stream.write(ch)
            self.column = 0
            self.line += 1

    def _folded(self, value: str, i: int, split: bool, spaces: bool, inner: bool) -> bool:
        """Whether the space at `i` becomes a line break (go-yaml folds at the first space of a run
        past the width; quoted strings never at their first or last character)."""
        if not split or spaces or self.column <= self.best_width:
            return False
        return not inner or 0 < i < len(value) - 1

    def write_plain(self, text: str, split: bool = True) -> None:
        if self.root_context:
            self.open_ended = True
        if not self.whitespace:
            self._put(" ")
        self._quoted_body(text, split, inner=False, quote="")
        self.whitespace = self.indention = False

    def write_single_quoted(self, text: str, split: bool = True) -> None:
        self.write_indicator("'", True)
        self._quoted_body(text, split, inner=True, quote="'")
        self.write_indicator("'", False)
        self.whitespace = self.indention = False

    def _quoted_body(self, text: str, split: bool, inner: bool, quote: str) -> None:
        spaces = breaks = False
        for i, ch in enumerate(text):
            if ch == " ":
                next_space = i + 1 < len(text) and text[i + 1] == " "
                if self._folded(text, i, split, spaces, inner) and not next_space:
                    self.write_indent()
                else:
                    self._put(ch)
                spaces = True
            elif ch in _BREAKS:
                if not breaks and ch == "\n":
                    self.write_line_break()
                self._write_break(ch)
                self.indention = breaks = True
            else:
                if breaks:
                    self.write_indent()
                self._put(ch + ch if ch == quote else ch)
                self.indention = spaces = breaks = False

    def write_double_quoted(self, text: str, split: bool = True) -> None:
        self.write_indicator('"', True)
        starts_with_bom = text.startswith("\ufeff")  # go-yaml's is_bom looks at the value's start, wherever it is
        spaces = False
        for i, ch in enumerate(text):
            if not printable(ch) or starts_with_bom or ch in _BREAKS or ch in '"\\':
                code = ord(ch)
                letter = _ESCAPES.get(ch)
                if letter is None:
                    letter = f"x{code:02X}" if code <= 0xFF else (f"u{code:04X}" if code <= 0xFFFF else f"U{code:08X}")
                self._put("\\" + letter)
                spaces = False
            elif ch == " ":
                if self._folded(text, i, split, spaces, inner=True):
                    self.write_indent()
                    if text[i + 1] == " ":
                        self._put("\\")
                else:
                    self._put(ch)
                spaces = True
            else:
                self._put(ch)
                spaces = False
        self.write_indicator('"', False)
        self.whitespace = self.indention = False
