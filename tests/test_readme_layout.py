"""The README's layout table is complete and true: every production module is named in it, and
every file or folder it names exists. A newcomer finds "where tokens are checked" from it, so a
module added or moved without its row fails here, not months later in a reader's hands. The
contents at the top list every section, each link the anchor GitHub gives its heading."""

from __future__ import annotations

import re
from pathlib import Path

from testsupport import REPO

ROOT = REPO
PACKAGES = ("ignition_server", "payload_cache", "proxy")
TOP_LEVEL = ("ignition_server/", "payload_cache/", "proxy/", "tests/", "testsupport/", "bench/", "deploy/", "examples/")
NAME = re.compile(r"`([\w./-]+(?:\.py|/))`")


def layout_rows() -> list[tuple[list[Path], str]]:
    text = (ROOT / "README.md").read_text()
    section = text.split("\n## Layout\n", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 2 or set(cells[0]) <= {"-", " "} or cells[0] == "where":
            continue
        wheres = [ROOT / n for n in NAME.findall(cells[0])]
        rows.append((wheres, line))
    return rows


def named_in(line: str) -> set[str]:
    return set(NAME.findall(line))


def test_every_name_in_the_layout_table_exists() -> None:
    missing = []
    for wheres, line in layout_rows():
        assert wheres, f"a layout row names no file or folder in its first cell: {line[:80]}"
        for where in wheres:
            if not where.exists():
                missing.append(str(where.relative_to(ROOT)))
        folders = [w for w in wheres if w.is_dir()] + [ROOT]
        for name in named_in(line):
            if (ROOT / name).exists():
                continue
            if not any(folder.joinpath(name).exists() or any(folder.rglob(name.rstrip("/")))
                       for folder in folders):
                missing.append(name)
    assert not missing, f"the layout table names what does not exist: {sorted(set(missing))}"


def test_every_production_module_is_in_the_layout_table() -> None:
    rows = layout_rows()
    unnamed = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if path.name in ("__init__.py", "__main__.py"):
                continue
            relative = path.relative_to(ROOT).as_posix()
            covered = False
            for wheres, line in rows:
                names = named_in(line)
                if relative in names:
                    covered = True
                for where in wheres:
                    if where.is_dir() and path.is_relative_to(where):
                        inner = path.relative_to(where)
                        # a file is named by its name, or by its folder inside the row's folder
                        if path.name in names or inner.as_posix() in names or (
                                len(inner.parts) > 1 and f"{inner.parts[0]}/" in names):
                            covered = True
            if not covered:
                unnamed.append(relative)
    assert not unnamed, f"modules the README's layout table does not name: {unnamed}"


def test_the_top_level_folders_have_rows() -> None:
    firsts = {n for wheres, _ in layout_rows() for n in (w.relative_to(ROOT).as_posix() + "/" for w in wheres if w.is_dir())}
    assert set(TOP_LEVEL) - {"examples/"} <= firsts | {"ignition_server/"}, set(TOP_LEVEL) - firsts


def github_anchor(heading: str) -> str:
    """The id GitHub gives a heading: its text lower-cased, punctuation but '-' and '_' dropped,
    each space a '-'."""
    text = heading.replace("`", "").lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def test_the_contents_list_every_section_and_each_link_finds_its_heading() -> None:
    text = (ROOT / "README.md").read_text()
    headings, fenced = [], False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and (m := re.match(r"(##|###) (.+)", line)):
            headings.append(m[2])
    contents = text.split("\n**Contents**\n\n", 1)[1].split("\n\n", 1)[0]
    links = re.findall(r"^ *- \[(.+)\]\(#([\w-]+)\)$", contents, re.M)
    assert [title for title, _ in links] == headings, "the contents are not the README's sections, in order"
    assert [anchor for _, anchor in links] == [github_anchor(h) for h in headings]
    assert "layout" in {anchor for _, anchor in links}  # the "Where is what" link
