#!/usr/bin/env bash
# Checks the links of every Markdown file in the repository (README.md, docs/*.md and any
# other *.md outside target/ and hidden folders):
#
# - a relative link, [text](path) or [text](path#anchor) (images and reference definitions
#   too), must name a file or folder inside the repository, and its #anchor a heading (or an
#   <a id/name>) of that file;
# - no link and no text may point outside the repository: a path that climbs out of it
#   (../shared/…), a path into a workspace or home folder (/work/…, /home/…, /root/…,
#   /Users/…), an absolute link or a file: URL.
#
# http(s):// and mailto: links are not followed. Needs bash and python3 only.
#
#   scripts/check-links.sh
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh

problems=$(python3 - <<'PYTHON'
import os
import re

ROOT = os.path.realpath(".")

# Folders a Markdown file is never taken from: build output, and hidden folders (.git, …).
SKIP_DIRS = {"target", "node_modules"}

def markdown_files():
    for top, dirs, files in os.walk(ROOT):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in SKIP_DIRS)
        for name in sorted(files):
            if name.endswith(".md"):
                yield os.path.join(top, name)

FENCE = re.compile(r"^\s{0,3}(```|~~~)")
INLINE_CODE = re.compile(r"(`+)(?:(?!\1).)*?\1")
# [text](target) and ![alt](target); target may be <…>, and may carry a "title".
INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*(<[^>]*>|[^()\s]*(?:\([^()\s]*\)[^()\s]*)*)(?:\s+[\"'(][^)]*)?\s*\)")
# [label]: target
REFERENCE = re.compile(r"^[ \t]{0,3}\[[^\]]+\]:[ \t]*(<[^>]*>|\S+)", re.MULTILINE)
HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
HTML_ANCHOR = re.compile(r"<a\s[^>]*(?:id|name)\s*=\s*[\"']([^\"']+)[\"']", re.IGNORECASE)
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")
# Paths into a workspace or a person's home on one machine: nothing in the repository may
# depend on them. (Deployment paths in examples, such as /srv/herald or /var/lib/herald,
# are fine.)
MACHINE_PATH = re.compile(r"(?<![\w.~/-])(/(?:work|home|root|Users)/[^\s`'\")\]]*)")
# A relative path climbing out of its folder: ../something
CLIMB = re.compile(r"(?<![\w.~/-])((?:\.\./)+[^\s`'\")\]<>|,;]*)")

def slug(text):
    """The anchor GitHub gives a heading."""
    text = re.sub(r"<[^>]+>", "", text)                   # inline HTML
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)  # links keep their text
    text = text.replace("`", "").lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")

anchor_cache = {}

def anchors(path):
    if path not in anchor_cache:
        found, seen, fenced = set(), {}, False
        with open(path, encoding="utf-8") as handle:
            for line in handle:
                if FENCE.match(line):
                    fenced = not fenced
                    continue
                if fenced:
                    continue
                found.update(HTML_ANCHOR.findall(line))
                match = HEADING.match(line)
                if match:
                    base = slug(match.group(2))
                    count = seen.get(base, 0)
                    seen[base] = count + 1
                    found.add(base if count == 0 else f"{base}-{count}")
        anchor_cache[path] = found
    return anchor_cache[path]

def inside(path):
    return path == ROOT or path.startswith(ROOT + os.sep)

def check_target(source, target):
    """What is wrong with a link to `target` from the file `source`, or None."""
    if target.startswith("<") and target.endswith(">"):
        target = target[1:-1]
    if not target:
        return "empty link"
    if SCHEME.match(target):
        if target.lower().startswith("file:"):
            return "a file: URL points outside the repository"
        return None  # http(s), mailto, …: not followed
    path, _, anchor = target.partition("#")
    if path.startswith("/"):
        return "an absolute path points outside the repository; link relative to this file"
    resolved = os.path.realpath(os.path.join(os.path.dirname(source), path)) if path else source
    if not inside(resolved):
        return "points outside the repository"
    if not os.path.exists(resolved):
        return "no such file in the repository"
    if anchor and os.path.isfile(resolved) and resolved.endswith(".md") and anchor not in anchors(resolved):
        return f"no heading with anchor #{anchor} in {os.path.relpath(resolved, ROOT)}"
    return None

def text_outside(source, line):
    """Mentions in plain text or code that point outside the repository."""
    trim = lambda mention: mention.rstrip(".,:;!?")
    bad = [(trim(m), "a path on one machine, outside the repository") for m in MACHINE_PATH.findall(line)]
    for climb in map(trim, CLIMB.findall(line)):
        resolved = os.path.realpath(os.path.join(os.path.dirname(source), climb))
        if not inside(resolved):
            bad.append((climb, "climbs out of the repository"))
    return bad

def prose_of(text):
    """The text without fenced code blocks (kept as empty lines) and inline code spans."""
    lines, fenced = [], False
    for line in text.split("\n"):
        if FENCE.match(line):
            fenced = not fenced
            lines.append("")
        else:
            lines.append("" if fenced else INLINE_CODE.sub("", line))
    return "\n".join(lines)

problems = []
for source in markdown_files():
    name = os.path.relpath(source, ROOT)
    with open(source, encoding="utf-8") as handle:
        text = handle.read()
    # Links, which may wrap across lines, found in the prose.
    prose = prose_of(text)
    found = [(m.start(), m.group(1)) for m in INLINE_LINK.finditer(prose)]
    found += [(m.start(), m.group(1)) for m in REFERENCE.finditer(prose)]
    linked = {}
    for start, target in sorted(found):
        number = prose.count("\n", 0, start) + 1
        linked.setdefault(number, set()).add(target.strip("<>").partition("#")[0])
        why = check_target(source, target)
        if why:
            problems.append((name, number, f"({target}) — {why}"))
    # Mentions anywhere, code included; a link reported above is not reported again.
    for number, line in enumerate(text.split("\n"), 1):
        for mention, why in text_outside(source, line):
            if mention not in linked.get(number, set()):
                problems.append((name, number, f"{mention} — {why}"))

print("\n".join(f"{name}:{number}: {what}" for name, number, what in sorted(problems)))
PYTHON
)

if [ -n "$problems" ]; then
    printf '%s\n' "$problems" >&2
    die "$(printf '%s\n' "$problems" | wc -l | tr -d ' ') link problem(s) in the Markdown files above: links must be relative, resolve inside the repository (file and #anchor), and no text may point outside it"
fi
