#!/usr/bin/env python3
"""Every relative link and #anchor in README.md and docs/ resolves.

    check_links.py REPO_ROOT

A link [text](target) whose target is not a URL must name a file or folder that exists,
relative to the Markdown file; a #fragment must be the anchor GitHub derives from a heading of
the target file (or of the same file): the heading's text without Markdown, lower-cased, every
character that is not a letter, digit, '_', '-' or space removed, spaces turned into '-', and
"-1", "-2", ... appended to repeats. Exits 1 listing every broken link, 0 when there is none.
"""
import re
import sys
from pathlib import Path

LINK = re.compile(r"(?<!!)\[(?:[^\[\]]|\[[^\]]*\])*\]\(([^()\s]+)(?:\s+\"[^\"]*\")?\)")
IMAGE = re.compile(r"!\[[^\]]*\]\(([^()\s]+)\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
FENCE = re.compile(r"^\s*(```|~~~)")


def strip_markdown(text):
    text = re.sub(r"`([^`]*)`", r"\1", text)                 # code spans keep their text
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)    # links and images keep their text
    return re.sub(r"<[^>]+>", "", text)                       # inline HTML


def github_anchor(heading):
    text = strip_markdown(heading).lower()
    text = "".join(c for c in text if c.isalnum() or c in "_- ")
    return text.replace(" ", "-")


def outside_code(lines):
    """The lines that are not inside fenced code blocks, with their numbers."""
    fenced = False
    for number, line in enumerate(lines, 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            yield number, line


def anchors_of(path, cache={}):
    if path not in cache:
        seen, anchors = {}, set()
        for _, line in outside_code(path.read_text(encoding="utf-8").splitlines()):
            match = HEADING.match(line)
            if not match:
                continue
            anchor = github_anchor(match.group(2))
            count = seen.get(anchor, 0)
            seen[anchor] = count + 1
            anchors.add(anchor if count == 0 else f"{anchor}-{count}")
        cache[path] = anchors
    return cache[path]


def broken_links(root):
    files = [root / "README.md"] + sorted((root / "docs").rglob("*.md"))
    broken = []
    for source in files:
        for number, line in outside_code(source.read_text(encoding="utf-8").splitlines()):
            line = re.sub(r"`[^`]*`", "", line)  # links inside code spans are not links
            for match in list(LINK.finditer(line)) + list(IMAGE.finditer(line)):
                target = match.group(1)
                if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                    continue
                path_part, _, fragment = target.partition("#")
                where = f"{source.relative_to(root)}:{number}: {target}"
                resolved = (source.parent / path_part).resolve() if path_part else source
                if not resolved.exists():
                    broken.append(f"{where}: no such file or folder")
                    continue
                if fragment:
                    if resolved.suffix != ".md" or resolved.is_dir():
                        broken.append(f"{where}: an #anchor into a file that is not Markdown")
                    elif fragment not in anchors_of(resolved):
                        broken.append(f"{where}: no heading of {resolved.relative_to(root)} "
                                      f"has the anchor #{fragment}")
    return files, broken


def self_test():
    """The checker finds what it must: a missing file, a missing anchor, a repeated heading."""
    import tempfile
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        (root / "docs").mkdir()
        (root / "docs" / "a.md").write_text("# Step 8: N = 1025, D \u00d7 2\n## Twice\n## Twice\n")
        (root / "README.md").write_text(
            "[ok](docs/a.md#step-8-n--1025-d--2) [ok](docs/a.md#twice-1) [ok](#x)\n# X\n"
            "[bad](docs/b.md) [bad](docs/a.md#twice-2) `[not a link](nowhere.md)`\n")
        _, broken = broken_links(root)
        found = sorted(line.split(": ")[1] for line in broken)
        return found == ["docs/a.md#twice-2", "docs/b.md"], found


def main():
    passed, found = self_test()
    if not passed:
        print(f"check_links.py: the self-test found {found}, not the two broken links planted")
        return 1
    root = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).parents[1]).resolve()
    files, broken = broken_links(root)
    for line in broken:
        print(line)
    print(f"check_links.py: {len(files)} Markdown files, {len(broken)} broken link(s)")
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
