"""``podman system service`` on sockets of their own: container hosts that tests can kill and restart."""

import signal
import socket
import subprocess
import time
from pathlib import Path


class PodmanService:
    """``podman system service`` on a socket of its own (the host's image store and config)."""

    def __init__(self, sock: Path, store: Path | None = None) -> None:
        self.sock = sock
        self.url = f"unix://{sock}"
        self.process: subprocess.Popen | None = None
        self.store = ["--root", f"{store}/root", "--runroot", f"{store}/run"] if store else []

    def start(self) -> None:
        self.sock.unlink(missing_ok=True)
        log = open(self.sock.with_suffix(".log"), "ab")  # noqa: SIM115 -- the child's
        with log:
            self.process = subprocess.Popen(
                ["podman", *self.store, "system", "service", "--time=0", self.url],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                cwd="/",  # conmon writes an `oom` marker into its working directory
            )

    def wait_until_answering(self) -> None:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                with socket.socket(socket.AF_UNIX) as probe:
                    probe.connect(str(self.sock))
                    probe.sendall(b"GET /_ping HTTP/1.0\r\n\r\n")
                    if b"OK" in probe.recv(4096):
                        return
            except OSError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"podman system service at {self.url} did not answer in 20 s")

    def kill(self) -> None:
        """SIGKILL the service, as a crash would; the containers' conmon processes live on."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait()

    def unmount_store(self) -> None:
        """Unmount what the service mounted under its own store (its overlay), after :meth:`kill`.

        A service killed with its store mounted leaves the mount behind, and the directory cannot
        be removed until it is gone.
        """
        if not self.store:
            return
        root = self.store[1].rsplit("/", 1)[0]
        mounts = [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()]
        for point in sorted((m for m in mounts if m.startswith(root + "/")), reverse=True):
            subprocess.run(["umount", "-l", point], check=False)
