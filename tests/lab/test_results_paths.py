"""Results name files relative to the repository: no results file holds an absolute path of the machine that made
it, and the writers make every path they are given relative."""
import glob
import json
import os
import sys

from conftest import ROOT

sys.path.insert(0, os.path.join(ROOT, "scripts"))
import harness  # noqa: E402


def strings(node, at=""):
    if isinstance(node, dict):
        for k, v in node.items():
            yield from strings(v, f"{at}/{k}")
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from strings(v, f"{at}/{i}")
    elif isinstance(node, str):
        yield at, node


def test_no_results_file_holds_an_absolute_path():
    files = glob.glob(os.path.join(ROOT, "results", "**", "*.json"), recursive=True)
    files += glob.glob(os.path.join(ROOT, "bench", "results", "*.json"))
    assert len(files) > 27
    found = []
    for path in files:
        with open(path) as f:
            for at, text in strings(json.load(f)):
                if harness.ABSOLUTE.search(text):
                    found.append(f"{os.path.relpath(path, ROOT)}:{at}: {harness.ABSOLUTE.search(text).group(0)}")
    for path in glob.glob(os.path.join(ROOT, "results", "**", "*.txt"), recursive=True):  # logs beside them
        for match in harness.ABSOLUTE.finditer(open(path).read()):
            found.append(f"{os.path.relpath(path, ROOT)}: {match.group(0)}")
    assert not found, "\n".join(found[:20])


def test_repo_relative_rewrites_checkouts_stashes_and_temp_directories():
    payload = {"log": f"wrote {harness.ROOT}/runs/x/ckpt.pt\nnext", "args": ["--data_dir=/root/stash/data/shakespeare",
                                                                           "--out=/tmp/work/original", "/root/out"],
               "n": 3, "dir": "/work/main/runs/a-map_file=/work/main/runs/b", "url": "https://example.org/tmp/x"}
    assert harness.repo_relative(payload) == {
        "log": "wrote runs/x/ckpt.pt\nnext", "args": ["--data_dir=data/shakespeare", "--out=<tmp>/work/original",
                                                     "<local>/out"],
        "n": 3, "dir": "runs/a-map_file=runs/b", "url": "https://example.org/tmp/x"}
