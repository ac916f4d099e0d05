"""A TCP proxy in front of MariaDB that can lose the reply to a COMMIT.

The one fault KILL cannot make: the server commits, and the client never hears it (a network cut,
a server crash right after the commit). The client's COMMIT then fails with "Lost connection"
(2013) although the order is in the database.
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
        self._stop = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

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
        cutting = False  # a COMMIT went to the server: cut the line before its reply comes back
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
                            cutting = True
                        server.sendall(data)
                    elif cutting:
                        self.commits_dropped += 1
                        return  # the server committed; the client never hears it
                    else:
                        client.sendall(data)
        except OSError:
            return
        finally:
            client.close()
            server.close()
