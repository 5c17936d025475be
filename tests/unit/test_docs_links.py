"""Every relative link of the README and docs/ resolves inside the repository: the file exists and an anchor names
one of the target's headings (GitHub's slugs), so moving a diary or renaming a section cannot strand a link."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def heading_slugs(path: Path) -> set[str]:
    slugs: set[str] = set()
    seen: dict[str, int] = {}
    in_code = False
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            in_code = not in_code
        if in_code or not line.startswith("#"):
            continue
        slug = re.sub(r"[^\w\- ]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        slugs.add(slug if n == 0 else f"{slug}-{n}")
    return slugs


def broken_links(root: Path) -> list[str]:
    bad = []
    for page in [root / "README.md", *sorted((root / "docs").rglob("*.md"))]:
        for target in LINK.findall(page.read_text()):
            if re.match(r"[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            where = f"{page.relative_to(root)}: {target}"
            if not dest.is_relative_to(root):
                bad.append(f"{where}: outside the repository")
            elif not dest.exists():
                bad.append(f"{where}: no such file")
            elif anchor and dest.suffix == ".md" and anchor not in heading_slugs(dest):
                bad.append(f"{where}: no such heading")
    return bad


def test_readme_and_docs_links_resolve():
    assert broken_links(ROOT) == []


def test_a_stranded_link_is_reported(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# Title\n")
    (tmp_path / "README.md").write_text("[ok](docs/a.md#title) [gone](docs/b.md) [anchor](docs/a.md#nope) [up](../x)\n")
    assert len(broken_links(tmp_path)) == 3
