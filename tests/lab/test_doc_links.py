"""Every relative link in the docs and the generated tables points at a file that exists."""
import glob
import os
import re

from conftest import ROOT


def test_every_relative_link_resolves():
    docs = [os.path.join(ROOT, "README.md"), *glob.glob(os.path.join(ROOT, "docs", "*.md")),
            *glob.glob(os.path.join(ROOT, "results", "**", "*.md"), recursive=True)]
    broken = []
    for doc in docs:
        text = re.sub(r"```.*?```", "", open(doc, encoding="utf-8").read(), flags=re.S)  # code blocks are not links
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if target.startswith(("http:", "https:", "#", "mailto:")):
                continue
            path = os.path.normpath(os.path.join(os.path.dirname(doc), target.split("#")[0]))
            if not os.path.exists(path):
                broken.append(f"{os.path.relpath(doc, ROOT)} → {target}")
    assert not broken, "broken links:\n" + "\n".join(broken)
