"""The native path: journals' lines read by the JVM, planned by Python.

The Python Data Source API hands every row from a Python worker to the JVM as Arrow,
which caps a Python source at about a third of ``spark.read.text`` (measured). So
`read` plans here, as the ``gazette`` source does (journals, cover sets, offset and time
ranges, holes, splits), and has a small JVM reader (`CLASS`, Java sources beside this
module) read the planned fragment files itself: ``file:`` paths, or URLs signed for it
(S3 stores, or a broker's listing), in every codec (gzip, zstd and snappy framing through
the JVM's own and Spark's libraries), checking each whole fragment's SHA-1 and length as
the Python reader does. What it does not do goes to the ``gazette`` source as before:
framings other than ``lines``, ``readCommitted``, ``failOnDataLoss=false`` (a fragment
found corrupt at its end would already have given rows). Same rows, same columns.

The reader's jar is built on first use with the JDK's ``javac`` against pyspark's jars,
cached by its sources' digest (`jar`); a session takes it on its ``spark.jars``
(`with_native`), or `read` adds it to a running one.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import json
import logging
import os
import shutil
import subprocess
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from gazette.errors import GazetteError
from gazette.fragment.store import FileStore
from gazette_spark import plan as planning
from gazette_spark.options import ReadOptions

log = logging.getLogger("gazette_spark")
T = TypeVar("T")

#: The JVM reader's class (a DataSource V2 table provider; short name gazette-lines).
CLASS = "dev.gazette.spark.LinesSource"
SOURCES = Path(__file__).resolve().parent / "java"
#: Codecs the JVM reader decompresses.
CODECS = ("NONE", "GZIP", "GZIP_OFFLOAD_DECOMPRESSION", "ZSTANDARD", "SNAPPY")
#: How long URLs signed for the JVM reader stay valid.
SIGNED_SECONDS = 3600


class NativeUnavailable(GazetteError):
    """The JVM reader cannot be built or loaded here (no JDK, no pyspark jars)."""


def _pyspark_jars() -> Path:
    import pyspark

    jars = Path(pyspark.__file__).resolve().parent / "jars"
    if not jars.is_dir():
        raise NativeUnavailable(f"pyspark's jars are not at {jars}: the native reader is "
                                "built against them")
    return jars


def jar() -> Path:
    """The JVM reader's jar: built if this version of its sources has not been yet, in
    ``$GAZETTE_SPARK_JARS`` (default ``~/.cache/gazette-spark``)."""
    sources = sorted(SOURCES.rglob("*.java"))
    if not sources:
        raise NativeUnavailable(f"no Java sources under {SOURCES}")
    import pyspark

    digest = hashlib.sha256(pyspark.__version__.encode())
    for source in sources:
        digest.update(source.read_bytes())
    cache = Path(os.environ.get("GAZETTE_SPARK_JARS")
                 or Path.home() / ".cache" / "gazette-spark")
    out = cache / f"gazette-spark-native-{digest.hexdigest()[:16]}.jar"
    if out.exists():
        return out
    java_home = os.environ.get("JAVA_HOME")
    javac = str(Path(java_home) / "bin" / "javac") if java_home and \
        (Path(java_home) / "bin" / "javac").exists() else shutil.which("javac")
    if javac is None:
        raise NativeUnavailable("building the native reader needs a JDK's javac (Debian: "
                                "openjdk-17-jdk-headless), or set GAZETTE_SPARK_JARS to a "
                                "folder holding the built jar")
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        classes = Path(tmp) / "classes"
        proc = subprocess.run(
            [javac, "--release", "17", "-nowarn", "-encoding", "UTF-8",
             "-cp", str(_pyspark_jars() / "*"), "-d", str(classes), *map(str, sources)],
            capture_output=True, text=True, timeout=300, check=False)
        if proc.returncode:
            raise NativeUnavailable(f"javac failed building the native reader:\n"
                                    f"{proc.stderr[-4000:]}")
        built = Path(tmp) / "native.jar"
        with zipfile.ZipFile(built, "w", zipfile.ZIP_DEFLATED) as z:
            z.writestr("META-INF/MANIFEST.MF", "Manifest-Version: 1.0\n")
            z.writestr("META-INF/services/org.apache.spark.sql.sources.DataSourceRegister",
                       CLASS + "\n")
            for path in sorted(classes.rglob("*.class")):
                z.write(path, path.relative_to(classes).as_posix())
        os.replace(built, out)  # (atomic: a concurrent build makes the same bytes)
    log.info("gazette: built the native reader %s", out)
    return out


def with_native(builder: Any) -> Any:
    """`builder` (a ``SparkSession.Builder``) with the native reader on ``spark.jars``."""
    return builder.config("spark.jars", str(jar()))


def available(spark: Any) -> bool:
    """Whether `spark`'s JVM can load the native reader."""
    try:
        loader = spark._jvm.org.apache.spark.util.Utils.getContextOrSparkClassLoader()
        spark._jvm.java.lang.Class.forName(CLASS, False, loader)
    except Exception:  # noqa: BLE001 - py4j's error for a class it cannot find
        return False
    return True


def ensure(spark: Any) -> None:
    """Make the native reader loadable by `spark` (``ADD JAR`` on a running session)."""
    if not available(spark):
        spark.sql(f"ADD JAR '{jar()}'")
        if not available(spark):
            raise NativeUnavailable(f"{CLASS} is not loadable after ADD JAR: start the "
                                    "session with gazette_spark.native.with_native(builder)")


def natively(opts: ReadOptions) -> str:
    """Why a read cannot take the native path ("": it can)."""
    if opts.framing != "lines":
        return f"framing={opts.framing} is decoded in Python"
    if not opts.fail_on_data_loss:
        return "failOnDataLoss=false skips bad fragments before reading them (Python)"
    return ""


def _piece(piece: planning.Piece, url: str) -> dict[str, Any]:
    f = piece.fragment
    return {"url": url, "where": f"{f.backing_store}{f.path}" if f.backing_store else f.path,
            "codec": f.codec.name, "fragment_begin": f.begin, "fragment_end": f.end,
            "sha1": f.sha1.hex(), "begin": piece.begin, "end": piece.end,
            "head_cut": piece.head_cut, "tail_cut": piece.tail_cut}


async def _urls(slices: list[planning.Slice]) -> dict[planning.Piece, str]:
    """Where the JVM reads each piece: a file's path, a broker's signed URL, or one
    signed here for its store."""
    from datetime import timedelta

    out: dict[planning.Piece, str] = {}
    stores: dict[str, Any] = {}
    try:
        for s in slices:
            for p in s.pieces:
                if p.url:
                    out[p] = p.url
                    continue
                store = stores.get(p.fragment.backing_store)
                if store is None:
                    store = stores[p.fragment.backing_store] = planning.open_store(
                        p.fragment.backing_store)
                if isinstance(store, FileStore):
                    out[p] = Path(store.path_of(p.fragment)).as_uri()
                else:
                    out[p] = await store.sign(p.fragment, timedelta(seconds=SIGNED_SECONDS))
    finally:
        for store in stores.values():
            await store.close()
    return out


def plan_json(opts: ReadOptions) -> tuple[str, int]:
    """The read's slices as the JVM reader's ``slices`` option, and how many there are."""
    _, slices = _in_thread(lambda: _plan(opts))
    urls = _in_thread(lambda: asyncio.run(_urls(slices)))
    for codec in {p.fragment.codec.name for s in slices for p in s.pieces} - set(CODECS):
        raise NativeUnavailable(f"codec {codec} is not read natively")
    doc = [{"journal": s.journal, "pieces": [_piece(p, urls[p]) for p in s.pieces]}
           for s in slices]
    return json.dumps(doc), len(doc)


def _in_thread(fn: Callable[[], T]) -> T:
    """`fn()`, in a thread of its own if this one runs an event loop (planning runs one
    of its own: a caller in async code, a notebook, would refuse it)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return fn()
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(fn).result()


def _plan(opts: ReadOptions) -> tuple[planning.Plan, list[planning.Slice]]:
    from gazette_spark.source import _plan

    return _plan(opts)
