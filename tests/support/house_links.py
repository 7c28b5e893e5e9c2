"""Every relative link in the project's pages resolves: the file or folder exists, and a `#anchor` names a heading
of the page it points to (GitHub's heading ids). Every repository path a page names in its text (`tests/...py`,
`utils/...`, commands in code blocks too) exists, so a moved file cannot leave a page pointing at nothing."""
from __future__ import annotations

import re
from pathlib import Path

PAGES = ("README.md", "docs/*.md", "benchmarks/README.md", "rp2040/FORMAT.md", "credentials/README.md")
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
# A path from the repository's root in a page's text: a file of the project's kinds under one of its folders (not
# credentials/, whose key files are examples; not a `<placeholder>` or a glob).
NAMED_PATH = re.compile(r"(?<![\w/.<*-])((?:tests|utils|benchmarks|rp2040|configs|docs)/[\w./-]*\w"
                        r"\.(?:py|md|sh|yaml|txt))\b")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)


def pages(root: Path) -> list[Path]:
    return sorted({p for pattern in PAGES for p in root.glob(pattern) if p.is_file()})


def _prose(text: str) -> str:
    """The page without fenced code blocks and inline code, where brackets are not links."""
    return re.sub(r"`[^`\n]*`", "", FENCE.sub("", text))


def anchors(text: str) -> set[str]:
    """GitHub's ids for a page's headings: lower case, punctuation but `-` and `_` dropped, spaces as `-`,
    repeats numbered `-1`, `-2`, ..."""
    seen: dict[str, int] = {}
    ids = set()
    for heading in re.findall(r"^#{1,6}[ \t]+(.+?)[ \t#]*$", FENCE.sub("", text), re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.replace("`", "").strip().lower()).replace(" ", "-")
        ids.add(f"{slug}-{seen[slug]}" if slug in seen else slug)
        seen[slug] = seen.get(slug, 0) + 1
    ids.update(re.findall(r"<a (?:name|id)=\"([^\"]+)\"", text))
    return ids


def link_breaks(root: Path) -> list[str]:
    """Relative links (not http(s):, mailto:) of the pages that point at nothing."""
    breaks = []
    for page in pages(root):
        text = page.read_text(encoding="utf-8")
        for target in LINK.findall(_prose(text)):
            if re.match(r"[a-z][a-z0-9+.-]*:", target, re.I):
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            name = page.relative_to(root).as_posix()
            if not dest.exists():
                breaks.append(f"{name}: link {target}: no such file or folder")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest.read_text(encoding="utf-8")):
                breaks.append(f"{name}: link {target}: no heading #{anchor} in {dest.name}")
    return breaks


def path_breaks(root: Path) -> list[str]:
    """Repository paths named in the pages' text (outside HTML comments) that do not exist."""
    breaks = []
    for page in pages(root):
        text = re.sub(r"<!--.*?-->", "", page.read_text(encoding="utf-8"), flags=re.S)
        breaks += [f"{page.relative_to(root).as_posix()}: names {path}: no such file"
                   for path in sorted(set(NAMED_PATH.findall(text))) if not (root / path).exists()]
    return breaks
