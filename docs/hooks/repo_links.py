"""MkDocs hook: links from the guide to the repository's code, configs and folders of raw result files.

The pages read the same on GitHub and in the built site. MkDocs knows only the files under docs/, so it would
report a link to ``../jobs/configs/x.yaml`` as missing and a link to a folder as unrecognised. This hook checks
that each such target exists in the repository (a missing one fails the strict build) and points the link at it:
on ``repo_url`` when the site sets one, else at the checkout the site was built in.
"""

from __future__ import annotations

import html
import logging
import os
import re
from pathlib import Path

log = logging.getLogger("mkdocs.hooks.repo_links")
LINK = re.compile(r"(?<!!)\[([^\]]*)\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~)", re.MULTILINE)


def repo_href(target: Path, repo: Path, built_page: Path, repo_url: str | None, anchor: str) -> str:
    """Where a link to ``target`` (a file or folder of the repository) points from the built page."""
    if repo_url:
        kind = "tree" if target.is_dir() else "blob"
        href = f"{repo_url.rstrip('/')}/{kind}/HEAD/{target.relative_to(repo).as_posix()}"
    else:
        href = Path(os.path.relpath(target, built_page.parent)).as_posix() + ("/" if target.is_dir() else "")
    return href + (f"#{anchor}" if anchor else "")


def rewrite(markdown: str, page: Path, built_page: Path, docs_dir: Path, repo_url: str | None
            ) -> tuple[str, list[str]]:
    """``markdown`` with its links that leave ``docs_dir`` or name a folder pointed at the repository; and the
    targets that do not exist."""
    repo, missing = docs_dir.resolve().parent, []

    def link(match: re.Match[str]) -> str:
        text, url = match.groups()
        path, _, anchor = url.partition("#")
        if re.match(r"[a-z][a-z0-9+.-]*:", url) or not path:
            return match.group(0)
        target = (page.parent / path).resolve()
        if target.is_relative_to(docs_dir.resolve()) and not target.is_dir():
            return match.group(0)  # a page or a file of the site: MkDocs checks it
        if not target.exists() or not target.is_relative_to(repo):
            missing.append(url)
            return match.group(0)
        href = repo_href(target, repo, built_page, repo_url, anchor)
        if repo_url:
            return f"[{text}]({href})"
        return f'<a href="{html.escape(href)}">{text}</a>'  # raw HTML: MkDocs leaves it as it is

    parts, in_code = FENCE.split(markdown), False  # links inside fenced code are examples: left alone
    for i, part in enumerate(parts):
        if FENCE.fullmatch(part):
            in_code = not in_code
        elif not in_code:
            parts[i] = LINK.sub(link, part)
    return "".join(parts), missing


def on_page_markdown(markdown, page, config, files):
    """MkDocs' hook: rewrite the page's links to the repository; report the missing ones as warnings."""
    docs_dir = Path(config["docs_dir"])
    text, missing = rewrite(markdown, docs_dir / page.file.src_path, Path(page.file.abs_dest_path), docs_dir,
                            config.get("repo_url"))
    for url in missing:
        log.warning("Doc file '%s' links to '%s', which is not in the repository", page.file.src_uri, url)
    return text
