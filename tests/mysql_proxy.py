"""A TCP proxy in front of MariaDB that can lose the reply to a COMMIT, or to any statement.

The one fault KILL cannot make: the server commits, and the client never hears it (a network cut,
a server crash right after the commit). The client's COMMIT then fails with "Lost connection"
(2013) although the order is in the database. `drop_next_reply_to(b"UPDATE ...")` does the same
to the next statement that starts so: in autocommit that statement was its own COMMIT.
"""

from __future__ import annotations

import select
import socket
import threading

# A COM_QUERY packet: 3-byte length, sequence id 0, command 0x03, then the statement.
_COMMIT_QUERY = b"\x00\x03COMMIT"


class MySQLProxy:
    def __init__(self, host: str = "127.0.0.1", port: int = 3306) -> None:
        self.target = (host, port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.drop_next_commit_reply = threading.Event()
        self.commits_dropped = 0
        self._drop_reply_to: bytes | None = None
        self.replies_dropped = 0
        self._stop = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def drop_next_reply_to(self, statement_start: bytes) -> None:
        """Cut the line once the next statement starting with `statement_start` reached the server."""
        self._drop_reply_to = statement_start.upper()

    def _drops_reply(self, data: bytes) -> bool:
        prefix = self._drop_reply_to
        if prefix is None or data[4:5] != b"\x03" or data[5:5 + len(prefix)].upper() != prefix:
            return False
        self._drop_reply_to = None
        return True

    def close(self) -> None:
        self._stop.set()
        self.listener.close()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.target)
            threading.Thread(target=self._pump, args=(client, server), daemon=True).start()

    def _pump(self, client: socket.socket, server: socket.socket) -> None:
        cutting = ""  # "commit" or "reply": a statement went to the server; cut before its reply comes back
        try:
            while not self._stop.is_set():
                ready, _, _ = select.select([client, server], [], [], 0.2)
                for sock in ready:
                    data = sock.recv(65536)
                    if not data:
                        return
                    if sock is client:
                        if self.drop_next_commit_reply.is_set() and _COMMIT_QUERY in data[:16].upper():
                            self.drop_next_commit_reply.clear()
                            cutting = "commit"
                        elif self._drops_reply(data):
                            cutting = "reply"
                        server.sendall(data)
                    elif cutting:
                        if cutting == "commit":
                            self.commits_dropped += 1
                        else:
                            self.replies_dropped += 1
                        return  # the server did it; the client never hears it
                    else:
                        client.sendall(data)
        except OSError:
            return
        finally:
            client.close()
            server.close()
