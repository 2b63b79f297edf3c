"""Processes and readers shared by the edge/aggregator end-to-end suites (test tooling only)."""
from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import sqlite3
import struct
import subprocess
import threading
import time
from pathlib import Path

import pytest

from common import vigil_bin

# Every test edge proves this key (VIGIL_EDGE_KEY, inherited by the edge processes the suites start); the
# harness's aggregators hold it for the edge ids the suites use.
TEST_KEY_HEX = "5a" * 32
os.environ.setdefault("VIGIL_EDGE_KEY", TEST_KEY_HEX)
TEST_EDGE_IDS = ("e1", "e2e-edge", "vtest", "load-edge", "mixed-edge", "fenced", "gpu-edge", "subprocess",
                 "metrics-edge", "ledger-edge", "sweep", "bench-edge", "demo-edge", "pipeline-edge")


def write_keys(path: Path, edges=TEST_EDGE_IDS, key_hex: str = TEST_KEY_HEX) -> Path:
    """An aggregator keys file (edge id: hex key), readable by its owner only."""
    path.write_text("".join(f"{e}: {key_hex}\n" for e in edges))
    path.chmod(0o600)
    return path


def skip_without(model: Path, *tools: str):
    """Skips the calling test unless VIGIL_BIN, `model` and the command-line `tools` are there."""
    for need, what in ((vigil_bin(), "VIGIL_BIN"), *((shutil.which(t), t) for t in tools)):
        if not need:
            pytest.skip(f"{what} not available")
    if not model.is_file():
        pytest.skip(f"{model} missing (set VIGIL_SHARED_MODELS)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PgDb:
    """A PostgreSQL schema of one test (t_<random>) in the database VIGIL_TEST_POSTGRES names, read with psql;
    the aggregator stores into it through its URL's search_path option. Dropped by drop()."""

    class Error(Exception):
        pass

    def __init__(self, base_url: str):
        self.base_url = base_url
        self.schema = f"t_{os.getpid()}_{int(time.monotonic_ns() % 10**9)}"
        self._psql(base_url, f"CREATE SCHEMA {self.schema}")
        self.url = f"{base_url}{'&' if '?' in base_url else '?'}options=-csearch_path%3D{self.schema}"

    @staticmethod
    def _psql(url: str, sql: str, variables: dict[str, str] | None = None) -> str:
        args = ["psql", url, "-X", "-q", "-At", "-F", "\t", "-v", "ON_ERROR_STOP=1"]
        for k, v in (variables or {}).items():
            args += ["-v", f"{k}={v}"]
        r = subprocess.run(args, input=sql, capture_output=True, text=True, timeout=60)
        if r.returncode != 0:
            raise PgDb.Error(f"psql: {sql}: {r.stderr.strip()}")
        return r.stdout

    def exists(self) -> bool:
        return True

    def query(self, sql: str, *args) -> list[tuple]:
        """`sql` with SQLite's ? placeholders; integers come back as int."""
        parts = sql.split("?")
        text = parts[0] + "".join(f":'a{i}'{part}" for i, part in enumerate(parts[1:]))
        out = self._psql(self.url, text + ";", {f"a{i}": str(a) for i, a in enumerate(args)})
        rows = []
        for line in out.splitlines():
            rows.append(tuple(int(v) if re.fullmatch(r"-?\d+", v) else v for v in line.split("\t")))
        return rows

    def drop(self):
        self._psql(self.base_url, f"DROP SCHEMA IF EXISTS {self.schema} CASCADE")


def postgres_or_skip() -> str:
    """VIGIL_TEST_POSTGRES; skips without it, fails instead when VIGIL_REQUIRE_POSTGRES=1 (scripts/test.sh)."""
    url = os.environ.get("VIGIL_TEST_POSTGRES", "")
    if not url:
        if os.environ.get("VIGIL_REQUIRE_POSTGRES") == "1":
            pytest.fail("VIGIL_REQUIRE_POSTGRES=1 but VIGIL_TEST_POSTGRES is not set")
        pytest.skip("PostgreSQL: set VIGIL_TEST_POSTGRES (scripts/postgres.sh start DIR prints one)")
    if not shutil.which("psql"):
        pytest.fail("psql not installed (Debian postgresql-client)")
    return url


@pytest.fixture(params=["sqlite", "postgresql"])
def engine(request):
    """The aggregator's database for a test: None (a SQLite file) or a PgDb, dropped afterwards."""
    if request.param == "sqlite":
        yield None
        return
    db = PgDb(postgres_or_skip())
    yield db
    db.drop()


class Aggregator:
    def __init__(self, tmp: Path, port: int, extra: str = "", pg: PgDb | None = None):
        self.port = port
        self.db = pg if pg is not None else tmp / "agg.db"
        self.config = tmp / "agg.yaml"
        self.http_port = free_port()
        keys = write_keys(tmp / "edge-keys.yaml")
        auth = "" if "auth:" in extra else f"auth: {{keys_file: {keys}}}\n"
        db = f"'{pg.url}'" if pg is not None else str(self.db)
        self.config.write_text(
            f"listen: 127.0.0.1:{port}\nhttp: 127.0.0.1:{self.http_port}\ndb: {db}\n{auth}{extra}")
        self.log = open(tmp / "agg.log", "ab")
        self.proc = None

    def start(self):
        self.proc = subprocess.Popen([vigil_bin(), "aggregator", "--config", str(self.config)],
                                     stdout=subprocess.PIPE, stderr=self.log)
        line = self.proc.stdout.readline().decode()
        assert line.startswith("vigil aggregator:"), f"aggregator did not start: {line!r}"
        # Its log lines follow on stdout: keep draining them into the log, or a long run fills the pipe and the
        # aggregator blocks in its logger (every session it sees logs a few lines).
        threading.Thread(target=self._drain, args=(self.proc.stdout,), daemon=True).start()

    def _drain(self, pipe):
        for chunk in iter(lambda: pipe.read1(65536), b""):
            self.log.write(chunk)
            self.log.flush()

    def kill(self, sig=signal.SIGKILL):
        self.proc.send_signal(sig)
        self.proc.wait(timeout=30)


def query(db, sql: str, *args):
    """Rows of `sql` (? placeholders) from the aggregator's database: a SQLite file or a PgDb."""
    if isinstance(db, PgDb):
        return db.query(sql, *args)
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10)
    try:
        return con.execute(sql, args).fetchall()
    finally:
        con.close()


def stored_frames(db: Path, stream: str) -> int:
    if not db.exists():
        return 0
    try:
        return query(db, "SELECT COUNT(*) FROM frames f JOIN streams s ON s.id = f.stream_id WHERE s.stream = ?",
                     stream)[0][0]
    except (sqlite3.OperationalError, PgDb.Error):  # schema not created yet
        return 0


def read_metrics(path: Path) -> dict[tuple[str, frozenset], float]:
    """A Prometheus text file -> {(name, frozenset of (label, value)): value}."""
    return parse_metrics(path.read_text())


def parse_metrics(text: str) -> dict[tuple[str, frozenset], float]:
    """Prometheus text -> {(name, frozenset of (label, value)): value}."""
    out = {}
    for line in text.splitlines():
        m = re.fullmatch(r"([a-zA-Z_:][\w:]*)(?:\{(.*)\})? (\S+)", line)
        if m and not line.startswith("#"):
            labels = frozenset(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))
            out[(m.group(1), labels)] = float(m.group(3))
    return out


def metric(metrics: dict, name: str, **labels) -> float:
    key = (name, frozenset(labels.items()))
    assert key in metrics, f"metric {name}{labels} missing; have {sorted(k for k in metrics if k[0] == name)}"
    return metrics[key]


class Camera:
    """A live camera: FFmpeg serves an endless 10 fps H.264 test picture (lavfi testsrc) as MPEG-TS on
    tcp://127.0.0.1:port to one client; start() again after that client went away."""

    def __init__(self, tmp: Path):
        self.port = free_port()
        self.log = open(tmp / "camera.log", "ab")
        self.proc = None

    def start(self):
        self.proc = subprocess.Popen(
            ["ffmpeg", "-v", "error", "-re", "-f", "lavfi", "-i", "testsrc=size=320x240:rate=10", "-c:v", "libx264",
             "-preset", "ultrafast", "-tune", "zerolatency", "-g", "10", "-f", "mpegts",
             f"tcp://127.0.0.1:{self.port}?listen=1"], stdout=self.log, stderr=self.log, stdin=subprocess.DEVNULL)
        return self

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)

    @property
    def url(self) -> str:
        return f"tcp://127.0.0.1:{self.port}"


def loopback_listener(backlog: int = 16) -> socket.socket:
    """A listening TCP socket on 127.0.0.1, on a free port (SO_REUSEADDR)."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", 0))
    s.listen(backlog)
    return s


def accept_each(listener: socket.socket, handle) -> None:
    """Calls handle(connection) for every connection `listener` accepts, on a daemon thread, until it is closed."""
    def loop():
        while True:
            try:
                c, _ = listener.accept()
            except OSError:
                return
            handle(c)
    threading.Thread(target=loop, daemon=True).start()


class FanOutCamera:
    """A live camera that serves several clients at once, as most network cameras do: FFmpeg encodes an endless
    10 fps H.264 test picture (lavfi testsrc) as MPEG-TS to a pipe, and every client connected to
    tcp://127.0.0.1:port gets the stream from the moment it joined (it decodes from the next keyframe, one a
    second). `connected_at` holds each client's time.monotonic() of connection."""

    def __init__(self, tmp: Path):
        self.log = open(tmp / "camera.log", "ab")
        self.listener = loopback_listener()
        self.port = self.listener.getsockname()[1]
        self.clients: list[socket.socket] = []
        self.connected_at: list[float] = []
        self.lock = threading.Lock()
        self.proc = None

    def start(self):
        self.proc = subprocess.Popen(
            ["ffmpeg", "-v", "error", "-re", "-f", "lavfi", "-i", "testsrc=size=320x240:rate=10", "-c:v", "libx264",
             "-preset", "ultrafast", "-tune", "zerolatency", "-g", "10", "-f", "mpegts", "pipe:1"],
            stdout=subprocess.PIPE, stderr=self.log, stdin=subprocess.DEVNULL)
        accept_each(self.listener, self._join)
        threading.Thread(target=self._pump, daemon=True).start()
        return self

    def _join(self, c: socket.socket):
        with self.lock:
            self.clients.append(c)
            self.connected_at.append(time.monotonic())

    def _pump(self):
        while chunk := self.proc.stdout.read1(65536):
            with self.lock:
                for c in list(self.clients):
                    try:
                        c.sendall(chunk)
                    except OSError:  # that client went away: the others go on
                        self.clients.remove(c)
                        c.close()

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)
        self.listener.close()
        with self.lock:
            for c in self.clients:
                c.close()

    @property
    def url(self) -> str:
        return f"tcp://127.0.0.1:{self.port}"


def stop(proc: subprocess.Popen | None, sig=signal.SIGTERM):
    """Asks `proc` to stop with `sig`; kills it after 60 s."""
    if proc is not None and proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


PROTOCOL_HEADER = 16  # transport/protocol.h: body length at bytes 8..11, message type at 5
REPORT, ACK = 2, 3   # protocol.h MessageType


class ReportProxy:
    """TCP proxy edge -> aggregator (test tooling) that reads the protocol's frames (16-byte header, body length at 8..11,
    type at 5) in both directions. Modes, per direction, switchable any time:
      acks:    'pass' | 'drop'             (aggregator -> edge Ack frames)
      reports: 'pass' | 'hold' | 'drop'    (edge -> aggregator Report frames; 'hold' buffers them until
                                            release(), which sends them on their connection)
    Every other frame (Hello, Welcome, Reject, Heartbeat) always passes."""

    def __init__(self, upstream_port: int):
        self.upstream = upstream_port
        self.acks, self.reports = "pass", "pass"
        self.lock = threading.Lock()
        self.held: list[tuple[socket.socket, bytes]] = []
        self.dropped_reports = 0
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.conns: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                edge, _ = self.sock.accept()
            except OSError:
                return
            agg = socket.create_connection(("127.0.0.1", self.upstream))
            with self.lock:
                self.conns += [edge, agg]
            threading.Thread(target=self._pump, args=(edge, agg, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(agg, edge, False), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, to_aggregator: bool):
        buf = b""
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                buf += data
                while len(buf) >= PROTOCOL_HEADER:
                    length = struct.unpack_from("<I", buf, 8)[0]
                    if len(buf) < PROTOCOL_HEADER + length:
                        break
                    frame, buf = buf[:PROTOCOL_HEADER + length], buf[PROTOCOL_HEADER + length:]
                    kind = frame[5]
                    with self.lock:
                        if to_aggregator and kind == REPORT and self.reports == "hold":
                            self.held.append((dst, frame))
                            continue
                        if to_aggregator and kind == REPORT and self.reports == "drop":
                            self.dropped_reports += 1
                            continue
                        if not to_aggregator and kind == ACK and self.acks == "drop":
                            continue
                    dst.sendall(frame)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def release(self) -> int:
        """Sends the held reports on their connections; returns how many went out."""
        with self.lock:
            held, self.held = self.held, []
            self.reports = "pass"
        sent = 0
        for dst, frame in held:
            try:
                dst.sendall(frame)
                sent += 1
            except OSError:
                pass
        return sent

    def close(self):
        self.sock.close()
        with self.lock:
            for c in self.conns:
                try:
                    c.close()
                except OSError:
                    pass
